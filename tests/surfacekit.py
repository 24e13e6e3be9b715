"""A registry with a turn surface over the reference ledger's tools, for the tests of
`toolfence serve` and the CLI (`TOOLFENCE_TOOLS=tests.surfacekit:registry`).

`chat` is the card surface a chat frontend's key runs under: its catalog holds the
balance read and two writes (`ledger.credit`, which needs no approval of its own,
and `ledger.transfer`), not `ledger.create_invoice`; every write becomes a pending
approval, decided by an approver or by the requester herself; each step lists the
requester's tenant's second account (`LISTED`). `lookup` offers the
balance read only (`writes="never"`).
"""

from __future__ import annotations

from typing import Any

from executor.core.approvers import ApproverPolicy
from executor.core.surfaces import Target, TurnSurface, Writes
from executor.core.tools import Registry
from executor.core.types import ServerContext
from ledger import tools as ledger_tools

CHAT = "chat"
LOOKUP = "lookup"
CHAT_TOOLS = frozenset({"ledger.get_balance", "ledger.credit", "ledger.transfer"})
OUTSIDE_CHAT = "ledger.create_invoice"


def listed_accounts(conn: Any, ctx: ServerContext) -> list[Target]:
    """The items a chat step lists: the tenant's second account, by a label the server wrote."""
    return [Target(f"{ctx.tenant}-2", "the second account")]


def surfaced_registry() -> Registry:
    """The ledger's tools, and the `chat` and `lookup` surfaces."""
    registry = Registry([
        ledger_tools.get_balance, ledger_tools.credit, ledger_tools.transfer,
        ledger_tools.create_invoice, ledger_tools.send_notice, ledger_tools.send_notices,
    ])
    registry.add_surface(TurnSurface(
        name=CHAT, tools=CHAT_TOOLS, writes=Writes.APPROVAL,
        approvers=ApproverPolicy.for_roles("approver", "member", allow_self_approval=True),
        targets=listed_accounts,
    ))
    registry.add_surface(
        TurnSurface(name=LOOKUP, tools=frozenset({"ledger.get_balance"}), writes=Writes.NEVER)
    )
    return registry


registry = surfaced_registry()
# The same tools, no surface declared: another deployment's registry.
bare_registry = Registry(list(registry))
