"""The record of vLLM's vendored files (tests/data/vllm/record.json): for
each verified release, its sdist's name and sha256 and each file copied
from it, by sha256. Standard library only.

    python tools/vendored.py check              # the files against the record (a test runs it)
    python tools/vendored.py compare RELEASE [--sdist PATH]
                                                # the record against the release's sdist
    python tools/vendored.py record RELEASE --sdist PATH
                                                # write RELEASE's entry from the files and the sdist

``compare`` fetches the sdist from PyPI unless given one, checks its sha256
against PyPI's and the record's, then each recorded file against the
sdist's member. tools/vllm_compat.sh runs it for the release it checks, so
that the record meets each sdist whenever a maintainer runs that tool; CI,
which installs 0.34.0 only, checks every release's files against the
record.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "vllm"
RECORD = DATA / "record.json"
SIMPLE = "https://pypi.org/simple/vllm/"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load(record: Path = RECORD) -> dict:
    with open(record, encoding="utf-8") as f:
        return json.load(f)


def vendored(data: Path, release: str) -> dict[str, str]:
    """Each file under data/release, by its path there (POSIX), to its sha256."""
    top = data / release
    return {
        path.relative_to(top).as_posix(): sha256(path.read_bytes())
        for path in sorted(top.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def check(data: Path = DATA, record: Path = RECORD) -> list[str]:
    """What differs between the vendored files and the record: [] if nothing."""
    entries = load(record)
    problems = []
    releases = sorted(p.name for p in data.iterdir() if p.is_dir())
    for release in sorted(set(releases) - set(entries)):
        problems.append(f"{release}: files here, no entry in {record.name}")
    for release, entry in sorted(entries.items()):
        if release not in releases:
            problems.append(f"{release}: an entry in {record.name}, no files here")
            continue
        have = vendored(data, release)
        want = entry["files"]
        for path in sorted(set(have) | set(want)):
            if path not in want:
                problems.append(f"{release}/{path}: not in the record")
            elif path not in have:
                problems.append(f"{release}/{path}: recorded, missing here")
            elif have[path] != want[path]:
                problems.append(f"{release}/{path}: sha256 {have[path]}, recorded {want[path]}")
    return problems


def _members(sdist: bytes) -> Iterator[tuple[str, bytes]]:
    """Each regular file in the sdist, by its path below the top directory."""
    with tarfile.open(fileobj=io.BytesIO(sdist), mode="r:gz") as tar:
        for member in tar:
            if member.isfile():
                _, _, path = member.name.partition("/")
                extracted = tar.extractfile(member)
                if path and extracted is not None:
                    yield path, extracted.read()


def fetch(release: str) -> tuple[str, bytes]:
    """The release's sdist from PyPI, its sha256 checked against PyPI's."""
    request = urllib.request.Request(
        SIMPLE, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        index = json.load(response)
    name = f"vllm-{release}.tar.gz"
    for file in index["files"]:
        if file["filename"] == name:
            with urllib.request.urlopen(file["url"], timeout=600) as response:
                data = response.read()
            if sha256(data) != file["hashes"]["sha256"]:
                raise SystemExit(f"vendored: {name}'s sha256 is not PyPI's")
            return name, data
    raise SystemExit(f"vendored: PyPI has no {name}")


def compare(release: str, sdist: bytes, record: Path = RECORD) -> list[str]:
    """What differs between the record's entry for release and its sdist."""
    entry = load(record).get(release)
    if entry is None:
        return [f"{release}: no entry in {record.name}"]
    problems = []
    if sha256(sdist) != entry["sdist_sha256"]:
        problems.append(
            f"{release}: the sdist's sha256 is {sha256(sdist)}, recorded {entry['sdist_sha256']}"
        )
    members = dict(_members(sdist))
    for path, digest in sorted(entry["files"].items()):
        if path not in members:
            problems.append(f"{release}/{path}: not in {entry['sdist']}")
        elif sha256(members[path]) != digest:
            problems.append(f"{release}/{path}: differs from {entry['sdist']}'s")
    return problems


def record_entry(
    release: str, name: str, sdist: bytes, data: Path = DATA, record: Path = RECORD
) -> list[str]:
    """Write release's entry from its vendored files, each of which must be
    the sdist's member byte for byte; returns what is not."""
    files = vendored(data, release)
    members = dict(_members(sdist))
    problems = [
        f"{release}/{p}: not the sdist's"
        for p, d in files.items()
        if p not in members or sha256(members[p]) != d
    ]
    if not problems:
        entries = load(record) if record.exists() else {}
        entries[release] = {"sdist": name, "sdist_sha256": sha256(sdist), "files": files}
        record.write_text(
            json.dumps(dict(sorted(entries.items())), indent=2) + "\n", encoding="utf-8"
        )
    return problems


def _sdist(release: str, path: str | None) -> tuple[str, bytes]:
    if path is None:
        return fetch(release)
    return os.path.basename(path), Path(path).read_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="the vendored files against the record")
    for name in ("compare", "record"):
        p = sub.add_parser(name)
        p.add_argument("release")
        p.add_argument(
            "--sdist", required=name == "record", help="a local sdist (else fetched from PyPI)"
        )
    args = parser.parse_args(argv)
    if args.command == "check":
        problems = check()
        done = f"vendored: the files of {len(load())} releases match {RECORD.name}"
    elif args.command == "compare":
        problems = compare(args.release, _sdist(args.release, args.sdist)[1])
        done = f"vendored: vLLM {args.release}'s recorded files are its sdist's, byte for byte"
    else:
        problems = record_entry(args.release, *_sdist(args.release, args.sdist))
        done = f"vendored: recorded vLLM {args.release}"
    for problem in problems:
        print(f"vendored: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
