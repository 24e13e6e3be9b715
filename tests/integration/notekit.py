"""A one-tool registry for the hosted-path tests (test_hosted_calls,
test_hosted_approvals, test_hosted_bounds): `notes.read`, a public read that
echoes its text, so a proposal beside the provider-run calls has something to run.
test_producer builds its own tools from the same argument and output models."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from executor.core.tools import Access, Approval, Mode, Registry, RunContext, Tool


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class Out(BaseModel):
    text: str


def read_note(args: NoteArgs, ctx: RunContext) -> Out:
    return Out(text=args.text)


REGISTRY = Registry([
    Tool(
        name="notes.read", description="read a note", mode=Mode.READ, input_model=NoteArgs,
        output_model=Out, run=read_note, access=Access.public_tool(), untrusted_output=False,
        approval=Approval.never(),
    ),
])
