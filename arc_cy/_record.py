"""Recording what a running vLLM asks of its CPU cache: with
``ARC_CY_RECORD_TRACE=PATH`` set, each arc_cy policy writes one line a
finished request to PATH, in the trace format the replay reads
(``arc_cy._trace``). What a recording holds, and how to stop one:
docs/usage.md ("Recording your traffic").

Both constructors ask ``record_for`` for a ``Recorder`` (None when the
variable is unset), and the policy tells it what happened after a call
returns, never while it runs: ``arrive`` after ``on_request_access`` (a
request's first call is its arrival), ``missed`` after ``on_store_miss``
(its first is where its stores enter the order of the policy's events),
``pinned`` after ``mark_non_evictable`` (a load), ``finished`` after
``on_request_finished`` (its line), ``cleared`` after ``clear``. The
recorder never changes what the policy does and never raises: any failure
is one WARNING, and recording stops while the policy goes on. The caller's
thread only queues a finished request's keys and counts; a writer thread
makes the lines (a batch's ids in one call, in C without the GIL where the
core is built), opens the file and writes, so the scheduler never waits on
the disk.
"""

from __future__ import annotations

import atexit
import collections
import errno
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__
from ._flags import RECORDING
from ._guard import logger, vllm_version
from ._trace import FORMAT, encode_line
from ._vllm import HAVE_VLLM, CachePolicy

ENV, MAX_MB_ENV = RECORDING
MAX_MB = 4096
"""The default size limit: about a day of a busy server (20 requests a
second finishing, each of about 100 keys the CPU tier sees: 2 KB a line)."""
BACKLOG = 1 << 22
"""Keys waiting for the writer past which recording stops (a disk that does
not take them, about 90 MB of lines): the scheduler never waits, and the
memory they hold is bounded."""
FINISHED = "on_request_finished"
PERIOD = 0.1
"""Seconds between the writer's looks at the lines waiting."""
BATCH = 256
"""Lines the writer makes and writes at a time."""
IN_FLIGHT = 1 << 20
"""Requests in flight past which their arrivals are forgotten (a caller
that never finishes them): their lines take their finish's time."""

_monotonic_ns = time.monotonic_ns
KeyedIds = Callable[[list[Sequence[Any]], int, int], list[bytes]]


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & 0xFFFFFFFFFFFFFFFF


def siphash24(data: bytes, k0: int, k1: int) -> int:
    """SipHash-2-4 of data under the key (k0, k1): the compiled core's
    arc_siphash24 (arc_cy/_core/siphash.h), in Python."""
    mask = 0xFFFFFFFFFFFFFFFF
    v = [
        k0 ^ 0x736F6D6570736575,
        k1 ^ 0x646F72616E646F6D,
        k0 ^ 0x6C7967656E657261,
        k1 ^ 0x7465646279746573,
    ]

    def rounds(count: int) -> None:
        v0, v1, v2, v3 = v
        for _ in range(count):
            v0 = (v0 + v1) & mask
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & mask
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & mask
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & mask
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)
        v[:] = v0, v1, v2, v3

    n = len(data)
    end = n - n % 8
    for i in range(0, end, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    last = (n & 0xFF) << 56 | int.from_bytes(data[end:], "little")
    v[3] ^= last
    rounds(2)
    v[0] ^= last
    v[2] ^= 0xFF
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def keyed_ids(requests: list[Sequence[Any]], k0: int, k1: int) -> list[bytes]:
    """The compiled core's ``keyed_ids``, in Python: for each request's
    keys, each key's SipHash-2-4 under (k0, k1), its top 63 bits,
    comma-separated. TypeError for what is not a list of lists or tuples of
    bytes."""
    if type(requests) is not list:
        raise TypeError(f"keyed_ids: a list of requests, not {type(requests).__name__}")
    for r, keys in enumerate(requests):
        if type(keys) not in (list, tuple):
            raise TypeError(f"keyed_ids: request {r} is {type(keys).__name__}, not a list or tuple")
        for j, key in enumerate(keys):
            if type(key) is not bytes:
                raise TypeError(
                    f"keyed_ids: request {r}'s item {j} is {type(key).__name__}, not bytes"
                )
    return [b",".join(b"%d" % (siphash24(k, k0, k1) >> 1) for k in keys) for keys in requests]


def _key_bytes(key: Any) -> bytes:
    """A key that is not bytes (vLLM's are), as bytes: its repr."""
    return key if type(key) is bytes else repr(key).encode("utf-8", "backslashreplace")


def _int(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _lengths(keys: Sequence[Any], ctx: Any, per_key: bool) -> tuple[int, int, int, int | None]:
    """(input tokens, output tokens, loadable keys, tokens per key) of a
    finished request. Its counts are vLLM's where its context has them
    (0.34): then a key that ends past its prompt's last token but one is not
    loadable (vLLM computes a prompt's last token, so it never looks that
    key up). Else the input is the end position of its last key (keys are
    in prefix order), and every key is loadable. With per_key, the gcd of
    its keys' end positions (else None)."""
    position = getattr(ctx, "get_offload_key_position", None)
    try:
        prompt = _int(getattr(ctx, "num_prompt_tokens", None))
        total = _int(getattr(ctx, "num_tokens", None)) if prompt is not None else None
    except Exception:  # vLLM's, for a request the scheduler no longer has
        prompt = total = None
    loadable = len(keys)
    if prompt is None:
        prompt = (_int(position(keys[-1])) if position is not None else None) or 0
    elif position is not None:
        while loadable and (_int(position(keys[loadable - 1])) or 0) > prompt - 1:
            loadable -= 1
    gcd = None
    if per_key and position is not None:
        ends = [e for e in map(_int, map(position, keys)) if e]
        gcd = math.gcd(*ends) if ends else None
    output = total - prompt if total is not None and total >= prompt else 0
    return prompt, output, loadable, gcd


class Recorder:
    """One policy's recording: what each finished request asked, queued on
    the caller's thread; its lines made and written by a daemon thread that
    opens the file on the first one."""

    def __init__(self, path: str, limit: int, policy: Any, capacity: int, ids: KeyedIds) -> None:
        self.path, self.limit, self.ids = path, limit, ids
        self.on = True
        self.closing = False
        self.policy_name = type(policy).__name__
        self.capacity = capacity
        key = os.urandom(16)  # the ids' key: new for each recording, never written
        self.k0, self.k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
        self.start = time.monotonic_ns()
        # What the writer makes lines of: (keys, the request's context,
        # arrival ns, the device's hits, order), and counts of the keys
        # queued and written (each counter has one thread that writes it).
        self.lines: collections.deque[tuple[Sequence[Any], Any, int, int, tuple[int, int, int]]] = (
            collections.deque()
        )
        self.keys_queued = self.keys_written = 0
        self.written = 0  # bytes
        self.headed = False  # the first line is made
        # req_id -> _state() of each request in flight that reached the
        # policy: popped as it finishes, all of them as the cache is cleared
        # (their requests never finish here). seq counts the places in the
        # order: loads, first stores of a miss, finishes.
        self.arrivals: dict[Any, list[Any]] = {}
        self.seq = 0
        # The context of the request last placed whole (its stores' place
        # set): its further arrive() and missed() calls, most of them, have
        # nothing to note. Forgotten as it finishes or the cache is cleared.
        self.placed: Any = None
        # vLLM 0.33 and later show a load whole (on_request_access); before,
        # only its pins: the keys loads pinned since the requests in flight
        # arrived, each with its place (a request's forgotten as it finishes).
        self.by_access = hasattr(CachePolicy, "on_request_access")
        self.pins: dict[Any, int] = {}
        self.policy = weakref.ref(policy)
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()
        _RECORDERS.add(self)

    def stop(self, why: str) -> None:
        if self.on:
            self.on = False
            logger.warning("arc_cy: not recording to %s: %s. The policy goes on.", self.path, why)

    def arrive(self, keys: Any, ctx: Any) -> None:
        """on_request_access returned (vLLM 0.33 and later): the request's
        arrival, if this is its first call; before its first store of a
        miss, a load if its first key is pinned (else a store of ready keys
        alone, which pins nothing)."""
        if self.on and ctx is not self.placed:
            try:
                state = self._state(ctx.req_id)
                if state[2] is None and state[1] is None and keys:
                    policy = self.policy()
                    chunk = policy.get(keys[0]) if policy is not None else None
                    if chunk is not None and chunk.ref_cnt > 0:
                        self.seq += 1
                        state[2], state[3] = self.seq, keys[0]
            except Exception:  # no context, or no req_id: its finish's time serves
                pass

    def missed(self, ctx: Any) -> None:
        """on_store_miss returned: the request's first store of a miss, its
        stores' place in the order, and its arrival if nothing came
        before."""
        if self.on and ctx is not self.placed:
            try:
                state = self._state(ctx.req_id)
                if state[1] is None:
                    self.seq += 1
                    state[1] = self.seq
                self.placed = ctx
            except Exception:  # no context, or no req_id: its finish's time serves
                pass

    def _state(self, rid: Any) -> list[Any]:
        """Request rid's [arrival ns, its stores' place, its load's place,
        the first key it loaded], made at its first call."""
        state = self.arrivals.get(rid)
        if state is None:
            if len(self.arrivals) >= IN_FLIGHT:
                self.arrivals.clear()
            state = self.arrivals[rid] = [_monotonic_ns(), None, None, None]
        return state

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def pinned(self, key: Any) -> None:
        """mark_non_evictable returned: a load pinned key. What shows a
        load on vLLM 0.31 and 0.32, whose manager calls the policy with the
        request's context only as it stores (on 0.33 and later, arrive()
        sees a load whole): once a loaded key, the hottest note, kept to a
        dict assignment (the compiled core does it inline)."""
        if self.on and not self.by_access:
            self.seq = seq = self.seq + 1
            try:
                self.pins[key] = seq
            except Exception:  # an unhashable key: its request's line says less
                pass

    def cleared(self) -> None:
        """clear() returned: the requests in flight never finish here."""
        self.arrivals.clear()
        self.pins.clear()
        self.placed = None

    def finished(self, keys: Sequence[Any], reused: Any, ctx: Any) -> None:
        """on_request_finished returned, with the request's keys in prefix
        order (order_request_keys') and the keys it reused: its line, made
        and written by the writer."""
        if not self.on:
            return
        self.placed = None
        try:
            at, start, loaded, first_load = self.arrivals.pop(
                getattr(ctx, "req_id", None), (None, None, None, None)
            )
            if not keys:
                return  # nothing of it reached the CPU tier
            finish = self._next()
            if at is None:
                at = _monotonic_ns()
            # The device's hits: the leading keys it reused without a load.
            # vLLM's connector offers them for store only when it loaded
            # nothing, and never looks them up in the CPU tier.
            device, pins = 0, self.pins
            for key in keys:
                if key not in reused or key == first_load or key in pins:
                    break
                device += 1
            if not self.by_access and device < len(keys):
                # Its loads: the keys pinned right after the device's hits
                # (a load is a run of the prefix); the first pin is their place.
                loaded = pins.pop(keys[device], None)
                if loaded is not None:
                    for key in keys[device + 1 :]:
                        if pins.pop(key, None) is None:
                            break
                if len(pins) >= IN_FLIGHT:  # loads of requests that never finish here
                    pins.clear()
        except Exception as exc:
            self.stop(f"{type(exc).__name__}: {exc}")
            return
        if self.keys_queued - self.keys_written > BACKLOG:
            self.stop(f"the disk has not taken the last {BACKLOG:,} keys' lines")
            return
        store = finish if start is None else start
        order = (store if loaded is None else min(loaded, store), store, finish)
        self.lines.append((keys, ctx, at, device, order))
        self.keys_queued += len(keys)
        if self.thread is None:
            self.thread = threading.Thread(target=self._write, name="arc_cy-record", daemon=True)
            self.thread.start()

    def close(self) -> None:
        """The policy is gone: write what is queued, then the writer ends."""
        self.closing = True
        self.wake.set()

    def flush(self, stall: float = 5.0) -> None:
        """Wait until what is queued is written, unless the writer makes no
        progress for stall seconds (a disk that does not answer)."""
        if self.thread is None or os.getpid() != self.pid:
            return  # nothing written yet, or a forked child's copy
        self.wake.set()
        taken, since = self.keys_written, time.monotonic()
        while self.on and self.keys_written < self.keys_queued:
            if self.keys_written != taken:
                taken, since = self.keys_written, time.monotonic()
            elif time.monotonic() - since > stall:
                return
            self.wake.set()
            time.sleep(0.002)

    def _write(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
        flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            exists = exc.errno == errno.EEXIST
            self.stop(
                f"cannot create it: {'it exists (never overwritten)' if exists else exc.strerror}"
            )
            self.lines.clear()
            return
        try:
            while self.on:
                full = False
                while self.lines and not full:
                    # The caller's thread appends meanwhile: taken one by one.
                    taken = [self.lines.popleft() for _ in range(min(BATCH, len(self.lines)))]
                    batch: list[bytes] = []
                    size = self.written
                    for ids, entry in zip(self._ids([e[0] for e in taken]), taken):
                        line = self._line(ids, *entry)
                        if size + len(line) > self.limit:
                            full = True
                            break
                        batch.append(line)
                        size += len(line)
                    if batch:
                        self._write_lines(fd, batch)
                        self.keys_written += sum(len(e[0]) for e in taken[: len(batch)])
                if full:
                    self.stop(f"it reached its size limit, {self.limit >> 20} MiB ({MAX_MB_ENV})")
                elif self.closing:
                    break
                self.wake.wait(PERIOD)
                self.wake.clear()
        except OSError as exc:
            self.stop(f"writing failed: {exc.strerror or exc}")
        except Exception as exc:  # a line that cannot be made: a context that fails
            self.stop(f"{type(exc).__name__}: {exc}")
        finally:
            self.lines.clear()
            os.close(fd)

    def _ids(self, requests: list[Sequence[Any]]) -> list[bytes]:
        """The ids of a batch of requests' keys, hashed in one call."""
        try:
            return self.ids(requests, self.k0, self.k1)
        except TypeError:  # keys that are not bytes (vLLM's are)
            return self.ids([[_key_bytes(k) for k in keys] for keys in requests], self.k0, self.k1)

    def _line(
        self,
        ids: bytes,
        keys: Sequence[Any],
        ctx: Any,
        at: int,
        device: int,
        order: tuple[int, int, int],
    ) -> bytes:
        """A request's line (the file's first carries the header). What it
        reads of the context (its counts, its keys' positions) vLLM does
        not change once the request finished."""
        input_length, output_length, loadable, per_key = _lengths(keys, ctx, not self.headed)
        header = None
        if not self.headed:
            self.headed = True
            header = {
                "format": FORMAT,
                "tokens_per_key": per_key,
                "cache_capacity": self.capacity,
                "vllm": vllm_version(),
                "arc_cy": __version__,
                "policy": self.policy_name,
            }
        ms = max(0, at - self.start) // 1_000_000
        extra: dict[str, int | list[int]] = {"order": list(order)}
        if device:
            extra["device_hits"] = device
        if loadable < len(keys):
            extra["loadable"] = loadable
        return encode_line(ms, input_length, output_length, ids, header, extra)

    def _write_lines(self, fd: int, lines: list[bytes]) -> None:
        """Write the lines whole: a failed write is cut back to the last
        whole line written, so the file stays a valid trace."""
        data = b"".join(lines)
        done = 0
        try:
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError:
            whole = 0
            for line in lines:
                if whole + len(line) > done:
                    break
                whole += len(line)
            os.ftruncate(fd, self.written + whole)
            self.written += whole
            raise
        self.written += done


_RECORDERS: weakref.WeakSet[Recorder] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    # Writers are daemon threads: at exit, what is queued is written first.
    for rec in list(_RECORDERS):
        rec.flush()


def _limit() -> int:
    raw = os.environ.get(MAX_MB_ENV, "").strip()
    if not raw:
        return MAX_MB << 20
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"{MAX_MB_ENV}={raw!r} is not a positive whole number of MiB")
    return int(raw) << 20


def _fastest_ids() -> KeyedIds:
    """The compiled core's keyed_ids where the core is in use (imported),
    else this module's: the same ids."""
    compiled = getattr(sys.modules.get("arc_cy._core.arc"), "keyed_ids", None)
    return keyed_ids if compiled is None else compiled


def record_for(policy: Any, capacity: int, ids: KeyedIds | None = None) -> Recorder | None:
    """The recorder of a new policy of cache_capacity capacity when
    ARC_CY_RECORD_TRACE is set, else None; ids makes a line's ids (default:
    the fastest built). It never raises: what goes wrong is one WARNING,
    and None."""
    path = None
    try:
        template = os.environ.get(ENV, "")
        if not template:
            return None
        path = template.replace("{pid}", str(os.getpid()))
        if HAVE_VLLM and not hasattr(CachePolicy, FINISHED):  # vLLM 0.30
            raise RuntimeError(
                f"vLLM {vllm_version()}'s manager never calls {FINISHED} (0.31.0 and later "
                "do), so no request ends"
            )
        if os.path.lexists(path):
            raise FileExistsError("it exists (never overwritten)")
        rec = Recorder(path, _limit(), policy, capacity, ids or _fastest_ids())
        weakref.finalize(policy, rec.close)
        logger.info("arc_cy: recording what reaches the CPU cache policy to %s", path)
        return rec
    except Exception as exc:
        try:
            logger.warning("arc_cy: not recording to %s: %s. The policy goes on.", path, exc)
        except Exception:  # out of memory, or a logging handler that fails
            pass
        return None
