"""Shared by the CLI tests: named checks that collect failures, and the report that ends a test."""
import sys


class Checks:
    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failures = []

    def check(self, what, condition, detail=""):
        if condition:
            self.passed += 1
        else:
            self.failures.append(f"{what}: {detail}")
        return condition

    def finish(self):
        print(f"{self.name}: {self.passed} passed, {len(self.failures)} failed")
        for f in self.failures:
            print("FAILED", f)
        sys.exit(1 if self.failures else 0)
