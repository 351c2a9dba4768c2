"""The fuzz programs' common start (hostile_fuzz, surface_fuzz, faults_fuzz):
faulthandler on, the run's seed, and the line that names the run."""

from __future__ import annotations

import argparse
import faulthandler
import random
import sys


def seed_run(prog: str, args: argparse.Namespace, ci_seed: int, *shown: str) -> int:
    """Enable faulthandler (a crash prints every thread's stack) and return
    the seed: --seed, else the ci profile's fixed one (CI reaches the same
    counts every time), else a new one. Prints, on stderr, the run's mode,
    implementation, profile and seed, then shown, and how to rerun it."""
    faulthandler.enable()
    seed = args.seed
    if seed is None:
        seed = ci_seed if args.profile == "ci" else random.SystemRandom().randrange(2**32)
    words = [f"{prog}: mode={args.mode} impl={args.impl} profile={args.profile} seed={seed}"]
    print(*words, *shown, f"(rerun with --seed {seed})", file=sys.stderr, flush=True)
    return seed
