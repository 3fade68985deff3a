"""The demo's narrator: prints the story step by step, times each step and keeps score of the checks."""

from __future__ import annotations

import time


class Story:
    """Prints the narrative, times each step, and keeps score of the checks."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.step_t0 = self.t0
        self.n = 0
        self.failed: list[str] = []
        self.passed = 0

    def step(self, title: str) -> None:
        self.n += 1
        self.step_t0 = time.monotonic()
        print(f"\n[{self.n}] {title}", flush=True)

    def say(self, text: str) -> None:
        print(f"    {text}", flush=True)

    def check(self, ok: bool, claim: str) -> bool:
        if ok:
            self.passed += 1
            print(f"    ok    {claim}", flush=True)
        else:
            self.failed.append(claim)
            print(f"    FAIL  {claim}", flush=True)
        return ok

    def done(self) -> None:
        print(f"    ({time.monotonic() - self.step_t0:.1f} s)", flush=True)
