"""`<checkpoint>/stream.json`: what a restart of a stream replay must find again beside Spark's own checkpoint
(`query/`): the trace gate's results, whether the final rows were written and published (engine/stream/query.py,
"Exactly once")."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.plan import ReplayRequest

STATE_FILE = "stream.json"


@dataclass
class StreamCheckpoint:
    """`<checkpoint>/stream.json`: what a restart must find again, next to Spark's own checkpoint (`query/`)."""

    root: Path
    uid: str
    fingerprint: dict[str, Any]
    started: bool = False
    gated: bool = False
    quarantined: int = 0
    gate_report: str | None = None
    live: bool | None = None
    complete_as_is: bool = False
    rank_base: int | None = None
    final_written: bool = False
    published: bool = False

    @property
    def query_dir(self) -> Path:
        return self.root / "query"

    @property
    def final_dir(self) -> Path:
        return self.root / "final"

    @property
    def exclude_file(self) -> Path:
        return self.root / "exclude.json"

    @property
    def msg_ids_file(self) -> Path:
        return self.root / "msg_ids.npy"

    @classmethod
    def open(cls, root: Path, fingerprint: dict[str, Any]) -> StreamCheckpoint:
        from schemas.errors import BadInput

        path = root / STATE_FILE
        if path.is_file():
            raw = json.loads(path.read_text())
            if raw["fingerprint"] != fingerprint:
                raise BadInput(f"checkpoint {root} belongs to another stream replay ({raw['fingerprint']}); use a new "
                               "--checkpoint", rule="argument")
            return cls(root=root, **{k: v for k, v in raw.items() if k != "root"})
        if root.exists() and any(root.iterdir()):
            raise BadInput(f"checkpoint {root} is not empty and holds no {STATE_FILE}", rule="argument")
        ck = cls(root, uuid.uuid4().hex, fingerprint)
        ck.save()
        return ck

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        body = {k: v for k, v in self.__dict__.items() if k != "root"}
        tmp = self.root / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        os.replace(tmp, self.root / STATE_FILE)  # a kill leaves the old or the new file, never half of one


def fingerprint_of(manifest, runs, request: ReplayRequest) -> dict[str, Any]:
    return {"trace_id": manifest.trace_id, "duration_us": manifest.duration_us,
            "run_ids": [r.run_id for r in runs], "window_ms": request.window_ms,
            "allowed_lateness_ms": request.allowed_lateness_ms}


def default_checkpoint(lakehouse_root: Path, fingerprint: dict[str, Any]) -> Path:
    """One checkpoint per (trace, policies, window, lateness) under the lakehouse: re-running the command resumes."""
    digest = hashlib.sha1(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return lakehouse_root / "_checkpoints" / f"stream-{digest}"
