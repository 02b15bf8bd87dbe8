"""`federator node` with every HTTP request profiled (cProfile, one profiler per server thread).

    python -m tests.bench.profiled_node node --bootstrap-servers ... (the `federator node` flags)

Profiling starts on SIGUSR1 (so warm-up, imports and first-call caches stay out of it); the
profile goes to $FEDERATOR_BENCH_PROFILE (a pstats file) when the node stops. Only the request
threads are profiled: work in the dispatcher's pool (calls to other nodes) shows up as waiting.
The response body is drained inside the profile, so use it for small answers (point queries).
Profiling roughly doubles the cost of Python calls; read it for where time goes, not how much.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import signal
import sys
import threading

from federator.http import server as http_server

_local = threading.local()
_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()
_on = threading.Event()


def _profiler() -> cProfile.Profile:
    prof = getattr(_local, "prof", None)
    if prof is None:
        prof = _local.prof = cProfile.Profile()
        with _lock:
            _profiles.append(prof)
    return prof


class Profiled:
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        if not _on.is_set():
            return self.app(environ, start_response)
        prof = _profiler()
        prof.enable()
        try:
            it = self.app(environ, start_response)
            try:
                body = list(it)
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        finally:
            prof.disable()
        return body


def main() -> int:
    signal.signal(signal.SIGUSR1, lambda *_: _on.set())
    original = http_server.serve
    http_server.serve = lambda app, host, port, threads=8: original(Profiled(app), host, port, threads)
    from federator.http import granian_server

    class ProfiledGranian(granian_server.GranianServer):
        def __init__(self, app, *args, **kwargs) -> None:
            super().__init__(Profiled(app), *args, **kwargs)

    granian_server.GranianServer = ProfiledGranian  # type: ignore[misc]
    from federator.cli import main as cli_main

    try:
        return cli_main(sys.argv[1:])
    finally:
        with _lock:
            profs = [p for p in _profiles if p.getstats()]
        out = os.environ.get("FEDERATOR_BENCH_PROFILE")
        if out and profs:
            stats = pstats.Stats(profs[0])
            for p in profs[1:]:
                stats.add(p)
            stats.dump_stats(out)


if __name__ == "__main__":
    sys.exit(main())
