"""The ``stejax`` script and ``python -m stejax``.

The command line needs the extra ``stejax[cli]``; on a core-only install
(``pip install stejax``) this prints which extra to install and exits 2
instead of a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``stejax`` command line, or say which extra it needs."""
    try:
        from stejax.cli import main as cli
    except ModuleNotFoundError as error:
        from stejax._extras import missing_extra_message

        message = missing_extra_message(error, command="stejax")
        if message is None:
            raise
        print(message, file=sys.stderr)
        raise SystemExit(2) from None
    cli()


if __name__ == "__main__":
    main()
