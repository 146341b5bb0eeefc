"""`kcollect preview`: serve the built site on localhost for a look before publishing (the pages
also open from file://; a server shows them as GitHub Pages will)."""
from __future__ import annotations

import errno
import functools
import http.server
from pathlib import Path

import click

from .common import fail


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the standard library's signature
        pass


@click.command("preview")
@click.option("--dir", "site_dir", default="site", show_default=True, type=click.Path(file_okay=False),
              help="The folder `kcollect build-site` wrote.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (localhost only by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on; 0 takes a free one.")
def preview_cmd(site_dir: str, host: str, port: int) -> None:
    """Serve the site on localhost until Ctrl-C."""
    root = Path(site_dir)
    if not (root / "index.html").is_file():
        fail(f"no site in {root}/ (no index.html): run `kcollect build-site` first, or give --dir")
    handler = functools.partial(_Quiet, directory=str(root))
    try:
        server = http.server.ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        why = ("the port is in use; pick another --port (0 takes a free one)" if e.errno == errno.EADDRINUSE
               else e.strerror or str(e))
        fail(f"cannot listen on {host}:{port}: {why}")
    bound_host, bound_port = server.server_address[:2]
    click.echo(f"serving {root}/ at http://{bound_host}:{bound_port}/ (Ctrl-C to stop)", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
