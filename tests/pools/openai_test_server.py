"""A loopback OpenAI-compatible server for the pool-builder tests: canned answers plus injected faults.

The "model" solves 4x4 Sudoku prompts deterministically from ``(prompt, seed)``: a first-stage answer is a
wordy trace (short for most seeds, over 500 characters for some) whose solution is wrong for ~20% of the
seeds; a rewrite request (the builder's default rewrite prompt) gets a compact trace that keeps the
original answer. So the same request always gets the same text, and a retried or resumed build must
reproduce the uninterrupted pool byte for byte.

Faults: ``server.fault(index, body, attempt)`` returns ``None`` (answer normally) or one of
``"timeout"`` (sleep ``timeout_sleep_s`` before answering), ``"500"``, ``"503"`` (with ``Retry-After: 0``),
``"malformed"`` (invalid JSON), ``"no_choices"`` (valid JSON without ``choices``), ``"truncated"`` (the body
stops short of its ``Content-Length``), ``"reset"`` (the connection closes without a response), ``"401"``,
``"400"``, ``"length"`` (a 200 whose text was cut by ``max_tokens``: ``finish_reason="length"``),
``"surrogate"`` (a text with a lone surrogate ``\\ud800``), ``"huge_int"`` (a 5000-digit
``usage.completion_tokens``), ``"deep"`` (JSON nested 100,000 deep).
``attempt`` counts the requests seen with the same seed (1 = first). ``die_after=k`` makes the server stop
listening after ``k`` answered requests (the following connections are refused); ``restart()`` brings it
back on the same port.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from typing import Any, Callable

PUZZLE = re.compile(r"(?<![0-9])([0-4]{16})(?![0-9])")


def solve_sudoku(puzzle: str) -> str | None:
    """Backtracking 4x4 solver (the first solution in digit order)."""
    grid = [int(c) for c in puzzle]

    def ok(i: int, d: int) -> bool:
        r, c = divmod(i, 4)
        br, bc = r // 2 * 2, c // 2 * 2
        peers = {grid[r * 4 + k] for k in range(4)} | {grid[k * 4 + c] for k in range(4)}
        peers |= {grid[(br + a) * 4 + bc + b] for a in range(2) for b in range(2)}
        return d not in peers

    def fill(i: int) -> bool:
        if i == 16:
            return True
        if grid[i]:
            return fill(i + 1)
        for d in range(1, 5):
            if ok(i, d):
                grid[i] = d
                if fill(i + 1):
                    return True
        grid[i] = 0
        return False

    return "".join(map(str, grid)) if fill(0) else None


def canned_completion(content: str, seed: int) -> str:
    """The fake model's reply to ``content`` (the concatenated prompt) under ``seed``."""
    rng = random.Random(seed)
    if "### Original solution" in content:
        original = content.split("### Original solution", 1)[1].split("### Rewrite rules", 1)[0]
        answers = re.findall(r"<answer>(.*?)</answer>", original, flags=re.S)
        answer = answers[-1].strip() if answers else ""
        steps = re.findall(r"cell (\d),(\d) is (\d)", original)
        return ("<reasoning>" + "".join(f"{r}{c}{d}" for r, c, d in steps) + "</reasoning>\n<answer>" + answer
                + "</answer>")
    m = PUZZLE.search(content)
    if not m:
        return "<reasoning>no puzzle found</reasoning>\n<answer>0</answer>"
    puzzle = m.group(1)
    solution = list(solve_sudoku(puzzle) or "0" * 16)
    blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
    if blanks and rng.random() < 0.2:
        i = rng.choice(blanks)
        solution[i] = rng.choice([d for d in "1234" if d != solution[i]])
    lines = [f"cell {i // 4 + 1},{i % 4 + 1} is {solution[i]}" for i in blanks]
    filler = rng.randint(0, 2) if rng.random() < 0.7 else rng.randint(12, 18)
    lines += ["Let me verify every row, column and box once more before answering."] * filler
    return "<reasoning>\n" + "\n".join(lines) + "\n</reasoning>\n<answer>" + "".join(solution) + "</answer>"


class _Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class FakeOpenAIServer:
    """``with FakeOpenAIServer() as srv: srv.url`` -> ``http://127.0.0.1:<port>/v1``."""

    def __init__(
        self,
        model: str = "fake-qwen3",
        api_key: str | None = None,
        delay_s: float = 0.0,
        fault: Callable[[int, dict, int], str | None] | None = None,
        timeout_sleep_s: float = 1.0,
        die_after: int | None = None,
    ) -> None:
        self.model, self.api_key, self.delay_s, self.fault = model, api_key, delay_s, fault
        self.timeout_sleep_s, self.die_after = timeout_sleep_s, die_after
        self.lock = threading.Lock()
        self.index = 0
        self.answered = 0
        self.attempts: Counter = Counter()
        self.faults_sent: Counter = Counter()
        self.headers: list[dict[str, str]] = []  # every request's headers, in arrival order
        self.port = 0
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeOpenAIServer":
        self._httpd = _Server(("127.0.0.1", self.port), self._handler())
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def restart(self) -> None:
        self.stop()
        self.die_after = None
        self.start()

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _die(self) -> None:
        threading.Thread(target=self.stop, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _json(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
                self._raw(code, json.dumps(obj).encode(), headers)

            def _raw(self, code: int, data: bytes, headers: dict[str, str] | None = None) -> None:
                """Send ``data`` as an application/json body as it is (malformed bodies included)."""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    if server.die_after is not None and server.answered >= server.die_after:
                        dead = True
                    else:
                        dead = False
                        index = server.index
                        server.index += 1
                        server.attempts[body.get("seed")] += 1
                        attempt = server.attempts[body.get("seed")]
                if dead:
                    self.close_connection = True
                    return
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    return self._json(401, {"error": {"message": "invalid API key", "type": "authentication_error"}})
                fault = server.fault(index, body, attempt) if server.fault else None
                if fault:
                    with server.lock:
                        server.faults_sent[fault] += 1
                if server.delay_s:
                    time.sleep(server.delay_s)
                chat = self.path.endswith("/chat/completions")
                if not chat and not self.path.endswith("/completions"):
                    return self._json(404, {"error": {"message": f"no route {self.path}"}})
                if body.get("model") != server.model:
                    return self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                if fault == "401":
                    return self._json(401, {"error": {"message": "invalid API key"}})
                if fault == "400":
                    return self._json(400, {"error": {
                        "message": "max_tokens is too large for this model's context length"}})
                if fault == "500":
                    return self._json(500, {"error": {"message": "internal server error (injected)"}})
                if fault == "503":
                    return self._json(503, {"error": {"message": "server overloaded (injected)"}}, {"Retry-After": "0"})
                if fault == "reset":
                    self.close_connection = True
                    return
                if fault == "malformed":
                    return self._raw(200, b'{"choices": [{"message": {"content": "<reas')
                if fault in ("huge_int", "deep"):
                    text = '"<reasoning>x</reasoning>\\n<answer>1</answer>"'
                    if fault == "huge_int":
                        data = ('{"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": %s}, '
                                '"text": %s}], "usage": {"completion_tokens": 1%s}}'
                                % (text, text, "0" * 5000)).encode()
                    else:
                        data = b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
                    return self._raw(200, data)
                if fault == "no_choices":
                    return self._json(200, {"object": "chat.completion", "model": server.model})
                if fault == "timeout":
                    time.sleep(server.timeout_sleep_s)
                if chat:
                    content = "\n".join(m.get("content", "") for m in body.get("messages", []))
                else:
                    content = body.get("prompt", "")
                text = canned_completion(content, int(body.get("seed", 0)))
                finish = "stop"
                if fault == "length":
                    text, finish = text[: len(text) // 2], "length"
                if fault == "surrogate":
                    text = text.replace("</answer>", "\ud800</answer>")
                choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                resp = {"id": f"cmpl-{index}", "object": "chat.completion" if chat else "text_completion",
                        "model": server.model, "choices": [choice],
                        "usage": {"prompt_tokens": len(content), "completion_tokens": len(text),
                                  "total_tokens": len(content) + len(text)}}
                if fault == "truncated":
                    data = json.dumps(resp).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 3])
                    self.close_connection = True
                    return
                try:
                    self._json(200, resp)
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up (timeout)
                with server.lock:
                    server.answered += 1
                    if server.die_after is not None and server.answered >= server.die_after:
                        server._die()

        return Handler
