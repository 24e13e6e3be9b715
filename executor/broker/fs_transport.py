"""kombu's filesystem transport, with atomic message files and exchange tables.

The stock transport writes a message file in place: a consumer listing the
folder can move and read it before the producer has written it, and dies on the
empty JSON (celery/kombu#1551). Two processes binding a queue at once can
likewise create the exchange table twice and leave a reader with an empty file.
Here a message is written to a hidden temporary name and renamed into place, and
a new exchange table is created the same way (`os.link` refuses to overwrite a
table another process created first). The embedded default uses this class.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):  # type: ignore[misc]
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: `_get` matches `<prefix>.<queue>.msg` and never sees it.
        temporary = os.path.join(self.data_folder_out, f".{name}.tmp")
        try:
            with open(temporary, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(temporary, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        table = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        if not table.exists():
            entry = [[routing_key or "", pattern or "", queue or ""]]
            temporary = table.with_name(f".{table.name}.{uuid.uuid4().hex}.tmp")
            temporary.write_bytes(str_to_bytes(dumps(entry)))
            try:
                os.link(temporary, table)
                return
            except FileExistsError:
                pass  # another process created it first: add our binding to theirs
            finally:
                temporary.unlink(missing_ok=True)
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):  # type: ignore[misc]
    Channel = Channel
