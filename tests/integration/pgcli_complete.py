"""pgcli's own completer over a node's catalog, run as a script in the pgcli venv
(``python pgcli_complete.py PORT TEXT CURSOR``): loads the catalog as pgcli does at start-up
(every CompletionRefresher query) and prints the completions at CURSOR as JSON [text, meta] pairs.

Only pgcli here: the pgcli venv has nothing else.
"""

from __future__ import annotations

import json
import sys


def complete(port: int, text: str, cursor: int) -> list[list[str]]:
    from pgcli.completion_refresher import CompletionRefresher
    from pgcli.pgcompleter import PGCompleter
    from pgcli.pgexecute import PGExecute
    from prompt_toolkit.document import Document

    executor = PGExecute("federator", "tester", None, "127.0.0.1", port, "")
    completer = PGCompleter(smart_completion=True)
    for refresh in CompletionRefresher.refreshers.values():
        refresh(completer, executor)
    return [[c.text, c.display_meta_text] for c in completer.get_completions(Document(text, cursor), None)]


if __name__ == "__main__":
    print(json.dumps(complete(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))))
