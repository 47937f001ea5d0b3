"""A `deepinfer serve` process for the end-to-end server tests (test_serve*.py).

    srv = Server(binary, model, ["--api-key", KEY], headers={"Authorization": f"Bearer {KEY}"})
    status, headers, body = srv.request("POST", "/v1/completions", {"prompt": "hi"})
    srv.stop()  # SIGTERM, then the exit code

The server runs with one engine thread (DEEPINFER_NUM_THREADS=1, passive OpenMP waits: the test
machines have few cores) and two HTTP threads; its output goes to a temporary file (not a pipe,
which could fill up and block it), shown when it fails to start.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`deepinfer serve --model model` on a free port, healthy once constructed.

    headers: sent with every request (request(headers=...) adds to them; a None value drops one).
    max_model_len: passed as --max-model-len unless None. Response headers come back lower-cased.
    """

    def __init__(self, binary: Path, model: Path, extra: list[str] | None = None, *, headers: dict | None = None,
                 served_model_name: str = "tiny", max_model_len: int | None = 1024, timeout: float = 60):
        self.port = free_port()
        self.model = model
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        env = dict(os.environ, OMP_WAIT_POLICY="passive", DEEPINFER_NUM_THREADS="1")
        cmd = [str(binary), "serve", "--model", str(model), "--port", str(self.port), "--served-model-name",
               served_model_name, "--http-threads", "2"]
        if max_model_len is not None:
            cmd += ["--max-model-len", str(max_model_len)]
        cmd += list(extra or [])
        self.log = tempfile.TemporaryFile(mode="w+")  # not a pipe: a full pipe would block the server
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError(f"server did not become healthy in {timeout} s:\n{self.output()}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        """What the server printed so far."""
        self.log.seek(0)
        return self.log.read()

    def request(self, method: str, path: str, body: bytes | str | dict | list | None = None,
                headers: dict | None = None, timeout: float = 30) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            h = dict(self.headers)
            h.update(headers or {})
            h = {k: v for k, v in h.items() if v is not None}
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
