"""Print the pins of a lock (uv pip compile's output) that the named
packages need: theirs, and every pin whose `# via` names one already
needed, on one line. .ci/lint.sh installs the linters from these alone.

    python .ci/lock_pins.py .ci/requirements-py3.11.lock ruff cython-lint
"""

import re
import sys


def closure(lock: str, names: list[str]) -> list[str]:
    pins: dict[str, str] = {}
    users: dict[str, set[str]] = {}
    name = None
    with open(lock, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"([A-Za-z0-9_.-]+)==\S+", line)
            if m:
                name = m.group(1).lower()
                pins[name], users[name] = line.strip(), set()
            elif name is not None and line.lstrip().startswith("#"):
                text = line.lstrip()[1:].strip()  # "via a", "via", or "a"
                if text.startswith("via"):
                    text = text[3:]
                users[name].update(w.lower() for w in text.split())
    need = {n.lower() for n in names}
    missing = need - pins.keys()
    if missing:
        sys.exit(f"lock_pins: {lock} pins none of {sorted(missing)}")
    while True:
        more = {n for n, by in users.items() if by & need} - need
        if not more:
            return sorted(pins[n] for n in need)
        need |= more


if __name__ == "__main__":
    print(" ".join(closure(sys.argv[1], sys.argv[2:])))
