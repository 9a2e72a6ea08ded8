"""A hand service in a child process, for the crash tests. Run from the repository root as
``python -m tests.hand_child LEDGER WORKDIR PORTFILE [PORT]``; it listens on PORT (default:
any free port, so a restarted hand can take its predecessor's), writes its port to PORTFILE
once it listens and stops on SIGTERM.

Tools:
  count(tag)   append ``tag`` to WORKDIR/executions and return the number of executions
  block(tag)   append ``tag`` to WORKDIR/executions, create WORKDIR/started-TAG, then block
               for ever (the test kills the process)
  gate(tag)    append ``tag`` to WORKDIR/executions, create WORKDIR/started-TAG, wait until
               WORKDIR/release-TAG exists, then return like ``count``
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from wakeful.fleet.handserver import serve_hand


def main(ledger: str, workdir: str, portfile: str, port: str = "0") -> None:
    work = Path(workdir)

    def record(tag: str) -> int:
        with open(work / "executions", "a", encoding="utf-8") as f:
            f.write(tag + "\n")
            f.flush()
            os.fsync(f.fileno())
        return len((work / "executions").read_text(encoding="utf-8").splitlines())

    def count(tag: str) -> dict[str, object]:
        return {"tag": tag, "executions": record(tag)}

    def block(tag: str) -> None:
        record(tag)
        (work / f"started-{tag}").touch()
        while True:
            time.sleep(1)

    def gate(tag: str) -> dict[str, object]:
        executions = record(tag)
        (work / f"started-{tag}").touch()
        while not (work / f"release-{tag}").exists():
            time.sleep(0.02)
        return {"tag": tag, "executions": executions}

    def ready(host: str, port: int) -> None:
        tmp = Path(portfile + ".tmp")
        tmp.write_text(str(port), encoding="utf-8")
        tmp.replace(portfile)

    serve_hand(
        ledger,
        {"count": count, "block": block, "gate": gate},
        "127.0.0.1",
        int(port),
        on_ready=ready,
        log_level="warning",
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
