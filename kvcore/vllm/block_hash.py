"""vLLM's block hash chain: a full block is keyed by (its parent block's hash, its token ids).

vLLM v1 keys a full block by `hash(parent_hash, block_tokens)` with a seed (`NONE_HASH`) as the
first block's parent, so equal hashes mean equal prefixes up to collisions. kvsim needs the
same chaining, deterministic across runs and cheap enough to hash a 12 k-token prompt in one
vectorised pass, so the hash is not a cryptographic one but a polynomial hash of the whole
prefix under an invertible 64-bit mixer:

    word(t)    = mix(t + SALT)                              (uint64 arithmetic, mod 2**64)
    raw(child) = unmix(parent hash) * B**ps + sum_j word(tok_j) * B**(ps-1-j)
    hash       = mix(raw(child))                            (unmix(NONE_HASH) = 0)

`mix` is a bijection on 64-bit words, so a hash is a function of (parent hash, block tokens)
alone, exactly as vLLM's, while a request's blocks hash with one cumulative sum (`ChainHasher`):
at every block end k, raw_k = B**(k-1) * (raw0 * B + S_k), S_k = sum_{j<k} word_j * B**-j.
Collisions are possible, so the block pool compares the stored (parent, tokens) key on a hit.
"""

from __future__ import annotations

import numpy as np

#: parent hash of a request's first block
NONE_HASH = 0

_MASK = (1 << 64) - 1
_U64 = np.uint64
#: polynomial base (odd, hence invertible mod 2**64) and its inverse
_BASE = 0x9FB21C651E98DF25
_BASE_INV = pow(_BASE, -1, 1 << 64)
#: added to a token id before mixing, so token 0 does not map to 0
_SALT = 0x9E3779B97F4A7C15
_M1, _M2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53
_M1_INV, _M2_INV = pow(_M1, -1, 1 << 64), pow(_M2, -1, 1 << 64)
_S33 = _U64(33)


def _mix(x: np.ndarray) -> np.ndarray:
    """Invertible 64-bit finaliser (xor-shift / multiply); maps 0 to 0. uint64 in and out."""
    x = x ^ (x >> _S33)
    x = x * _U64(_M1)
    x = x ^ (x >> _S33)
    x = x * _U64(_M2)
    return x ^ (x >> _S33)


def _mix_into(x: np.ndarray) -> np.ndarray:
    """`_mix` of a uint64 array the caller owns, computed in place (no temporaries but one:
    a 45 k-token prompt at page size 1 is hashed in a few passes over one buffer)."""
    tmp = np.empty_like(x)
    for m in (_M1, _M2):
        np.right_shift(x, _S33, out=tmp)
        np.bitwise_xor(x, tmp, out=x)
        np.multiply(x, _U64(m), out=x)
    np.right_shift(x, _S33, out=tmp)
    return np.bitwise_xor(x, tmp, out=x)


def _unmix(x: np.ndarray) -> np.ndarray:
    """Inverse of `_mix` (a shift by 33 >= 32 bits is its own xor-shift inverse)."""
    x = x ^ (x >> _S33)
    x = x * _U64(_M2_INV)
    x = x ^ (x >> _S33)
    x = x * _U64(_M1_INV)
    return x ^ (x >> _S33)


def _mix_int(x: int) -> int:
    """`_mix` of one 64-bit word as a Python int (no numpy call: a few hundred ns where a
    numpy pass over a one-element array costs microseconds)."""
    x ^= x >> 33
    x = x * _M1 & _MASK
    x ^= x >> 33
    x = x * _M2 & _MASK
    return x ^ (x >> 33)


def _unmix_int(x: int) -> int:
    """`_unmix` of one 64-bit word as a Python int."""
    x ^= x >> 33
    x = x * _M2_INV & _MASK
    x ^= x >> 33
    x = x * _M1_INV & _MASK
    return x ^ (x >> 33)


def _token_words(tokens: np.ndarray) -> np.ndarray:
    """Token ids (int64) -> the mixed uint64 words the polynomial hash sums."""
    return _mix(np.ascontiguousarray(tokens, dtype=np.int64).view(_U64) + _U64(_SALT))


def _powers(base: int, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) mod 2**64 (uint64)."""
    pw = np.full(n, base, dtype=_U64)
    pw[0] = 1
    return np.cumprod(pw, dtype=_U64)


def block_hashes(parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Hashes (uint64) of m blocks from their parent hashes (m,) and token ids (m, page_size),
    each block on its own: the definition `ChainHasher` must agree with."""
    tokens = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    ps = tokens.shape[1]
    pw = _powers(_BASE, ps)[::-1]  # B**(ps-1) .. B**0
    raw = _unmix(np.asarray(parents, dtype=_U64)) * _U64(pow(_BASE, ps, 1 << 64))
    raw = raw + (_token_words(tokens) * pw[None, :]).sum(axis=1, dtype=_U64)
    return _mix(raw)


def block_hash(parent: int, tokens: bytes) -> int:
    """Chained hash of one full block from its parent hash and its token ids' int64 bytes."""
    toks = np.frombuffer(tokens, dtype=np.int64)
    return int(block_hashes(np.array([parent], dtype=_U64), toks[None, :])[0])


class ChainHasher:
    """Hashes every full block of a token sequence in one pass, for sequences of up to
    `max_len` tokens (the powers of the base are computed once). A few tokens (at most
    `small`) are hashed with Python ints instead: the vectorised pass is about twenty numpy
    calls whatever the length, each with a fixed cost, while a Python int loop costs per
    token; admission hashes the one block its peeks did not ask about (they look at the
    prompt less its last token) once per admitted request. The result is the same function,
    word for word."""

    #: token counts hashed with Python ints (tests/kvcore/test_block_hash.py compares both)
    small = 8

    def __init__(self, page_size: int, max_len: int) -> None:
        self.page_size = page_size
        self._bpow = _powers(_BASE, max_len + 1)  # B**k
        self._binv = _powers(_BASE_INV, max_len + 1)  # B**-k

    def chain(self, parent: int, ids: np.ndarray) -> np.ndarray:
        """Chained hashes (uint64) of the len(ids) // page_size full blocks of `ids` (int64),
        the first one's parent hash being `parent`."""
        ps = self.page_size
        m = len(ids) // ps
        if not m:
            return np.zeros(0, dtype=_U64)
        n = m * ps
        if n <= self.small:
            return self._chain_small(parent, ids[:n].tolist(), m)
        w = np.add(np.ascontiguousarray(ids[:n], dtype=np.int64).view(_U64), _U64(_SALT))
        w = _mix_into(w)  # the token words (`_token_words`)
        np.multiply(w, self._binv[:n], out=w)
        s = np.cumsum(w, dtype=_U64, out=w)
        raw0 = _unmix_int(int(parent)) * _BASE & _MASK
        # the prefix sums at block ends, in a new array; at page size 1 every prefix sum is
        # a block end, so the same buffer finishes the job
        ends = s if ps == 1 else s[ps - 1 : n : ps]
        out = np.add(ends, _U64(raw0), out=s if ps == 1 else None)
        np.multiply(out, self._bpow[ps - 1 : n : ps], out=out)
        return _mix_into(out)

    def _chain_small(self, parent: int, tokens: list[int], m: int) -> np.ndarray:
        """`chain` of `m` blocks of `tokens` (m * page_size ints) with Python ints: each
        block's raw value is unmix(parent) * B**ps + sum_j word(tok_j) * B**(ps-1-j), by
        Horner's rule from unmix(parent)."""
        ps = self.page_size
        out = np.empty(m, dtype=_U64)
        h = int(parent)
        at = 0
        for i in range(m):
            raw = _unmix_int(h)
            for t in tokens[at : at + ps]:
                raw = (raw * _BASE + _mix_int((t + _SALT) & _MASK)) & _MASK
            h = _mix_int(raw)
            out[i] = h
            at += ps
        return out
