"""``make test``: the default run as shards side by side (``pytest --shard K/N``, tests/shards.py).

``python -m tests.run_shards [pytest arguments]`` starts N pytest processes (FEDERATOR_TEST_SHARDS,
default 2) with the same arguments, each taking its share of the selected modules. Their progress
lines are printed as they come, each behind its shard's name; each shard's closing sections
(failures, errors, durations, its summary line) are printed as one block when it ends. The exit
status is the first shard's that failed: 0 only when every shard passed (a shard whose modules
the arguments left empty counts as passed). With -x, the first failure stops the other shards too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Sequence

from federator.broker import die_with_parent

NO_TESTS = 5  # pytest's exit code when nothing was selected
_CLOSING = re.compile(r"^=+ (?!test session starts).* =+$")  # FAILURES, ERRORS, slowest durations, summary
_PRINT = threading.Lock()


class Shard:
    def __init__(self, k: int, n: int, args: Sequence[str]) -> None:
        self.name = f"[{k}/{n}]"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", f"--shard={k}/{n}", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            preexec_fn=die_with_parent(signal.SIGTERM),  # a killed runner leaves no shard running
        )
        self.closing: list[str] = []
        self.reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self.reader.start()

    def _read(self, out: IO[str]) -> None:
        for line in out:
            if self.closing or _CLOSING.match(line):
                self.closing.append(line)
            else:
                with _PRINT:
                    print(f"{self.name} {line}" if line.strip() else line, end="", flush=True)

    def finish(self) -> int:
        """The shard's exit code, once it ended and its closing block is printed."""
        code = self.proc.wait()
        self.reader.join()
        with _PRINT:
            print(f"\n---------- shard {self.name}: exit {code} ----------", flush=True)
            closing = "".join(self.closing)
            print(closing, end="" if closing.endswith("\n") else "\n", flush=True)  # what it wrote at exit may not end a line
        return code


def exit_code(codes: Sequence[int]) -> int:
    failed = [c for c in codes if c not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(c == NO_TESTS for c in codes) else 0


def stops_at_first_failure(args: Sequence[str]) -> bool:
    return any(a in ("-x", "--exitfirst") or a.startswith("--maxfail") for a in args)


def run(args: Sequence[str], n: int) -> int:
    started = time.monotonic()
    shards = [Shard(k, n, args) for k in range(1, n + 1)]
    codes: dict[Shard, int] = {}
    while len(codes) < n:
        try:
            ended = next((s for s in shards if s not in codes and s.proc.poll() is not None), None)
            if ended is None:
                time.sleep(0.2)
                continue
            codes[ended] = ended.finish()
            if codes[ended] not in (0, NO_TESTS) and stops_at_first_failure(args):
                for other in shards:
                    if other not in codes:
                        other.proc.send_signal(signal.SIGINT)  # pytest stops, tears down and reports
        except KeyboardInterrupt:  # Ctrl-C reached the shards too: wait for their reports
            continue
    code = exit_code([codes[s] for s in shards])
    print(f"==> {n} shards in {time.monotonic() - started:.0f} s: "
          + ", ".join(f"{s.name} exit {codes[s]}" for s in shards) + f"; exit {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:], int(os.environ.get("FEDERATOR_TEST_SHARDS", "2"))))
