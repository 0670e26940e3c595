"""The physical KV buffer that the page table points into.

One tensor `(2, layers, num_pages + 1, page_size, kv_heads, head_dim)` (mini-sglang's layout):
page 0 is the dummy page that padded tokens write into. With `store=False` no buffer is
allocated but every shape and byte count stays exact, so an 80 GB pool can be simulated on a
laptop. fp8 is stored as uint8 bytes because index_put does not support float8 types.

Invariants (`check_invariants`):

    slots      = (num_pages + 1) * page_size
    size_bytes = bytes_per_token * slots = pairs * layers * prod(token shape) * elem * slots
    buffer (when stored): shape, dtype and device as declared, numel * elem == size_bytes
"""

from __future__ import annotations

import math

import torch

from kvcore.validation import InvariantError, positive_int

_TORCH_DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}


def torch_dtype(name: str) -> torch.dtype:
    key = name.lower()
    if key not in _TORCH_DTYPES:
        raise ValueError(f"unknown kv dtype {name!r}; known: {', '.join(_TORCH_DTYPES)}")
    return _TORCH_DTYPES[key]


class _TokenToKVPool:
    """Shared bookkeeping: shapes, bytes, slot checks. Subclasses define the per-token shape."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_layers: int,
        token_shape: tuple[int, ...],
        pairs: int,
        dtype: str,
        device: str | torch.device,
        store: bool,
    ) -> None:
        self.num_pages = positive_int("num_pages", num_pages)
        self.page_size = positive_int("page_size", page_size)
        self.num_layers = positive_int("num_layers", num_layers)
        self.dtype = torch_dtype(dtype)
        self.store_dtype = torch.uint8 if dtype.lower() == "fp8" else self.dtype
        self.device = torch.device(device)
        self.store = store
        self.shape = (pairs, num_layers, num_pages + 1, page_size, *token_shape)
        self.buffer: torch.Tensor | None = None
        if store:
            self.buffer = torch.zeros(self.shape, dtype=self.store_dtype, device=self.device)

    @property
    def slots(self) -> int:
        """Slots including the dummy page."""
        return (self.num_pages + 1) * self.page_size

    @property
    def bytes_per_token(self) -> int:
        per_elem = torch.empty((), dtype=self.store_dtype).element_size()
        return math.prod(self.shape[:2]) * math.prod(self.shape[4:]) * per_elem

    @property
    def size_bytes(self) -> int:
        """Bytes of the whole buffer (dummy page included), whether or not it is stored."""
        return self.bytes_per_token * self.slots

    def check_invariants(self) -> None:
        if self.slots != (self.num_pages + 1) * self.page_size:
            raise InvariantError("kv pool: slots != (num_pages + 1) * page_size")
        buf = self.buffer
        if buf is None:
            return
        on_device = buf.device.type == self.device.type and self.device.index in (
            None, buf.device.index)  # "cuda" means the current device, whichever index
        if tuple(buf.shape) != self.shape or buf.dtype != self.store_dtype or not on_device:
            raise InvariantError(
                f"kv pool: buffer {tuple(buf.shape)} {buf.dtype} on {buf.device}, declared "
                f"{self.shape} {self.store_dtype} on {self.device}"
            )
        if buf.numel() * buf.element_size() != self.size_bytes:
            raise InvariantError("kv pool: buffer bytes != size_bytes")

    def _check_slots(self, layer: int, slots: torch.Tensor) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} out of range [0, {self.num_layers})")
        if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= self.slots):
            raise ValueError(f"slot index out of range [0, {self.slots})")

    def _layer_view(self, which: int, layer: int) -> torch.Tensor:
        if self.buffer is None:
            raise RuntimeError("this KV pool was created with store=False and holds no data")
        return self.buffer[which, layer].view(self.slots, *self.shape[4:])

    def _to_store(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(device=self.device, dtype=self.dtype)
        return x.view(torch.uint8) if self.store_dtype == torch.uint8 else x

    def _from_store(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(self.dtype) if self.store_dtype == torch.uint8 else x


class MHATokenToKVPool(_TokenToKVPool):
    """K and V for every layer: per token `kv_heads x head_dim` each (MHA and GQA)."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str = "bf16",
        device: str | torch.device = "cpu",
        store: bool = True,
    ) -> None:
        shape = (positive_int("num_kv_heads", num_kv_heads), positive_int("head_dim", head_dim))
        super().__init__(num_pages, page_size, num_layers, shape, 2, dtype, device, store)

    def set_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V of `len(slots)` tokens (`[n, kv_heads, head_dim]` each) into their slots."""
        self._check_slots(layer, slots)
        if k.shape != v.shape or tuple(k.shape[1:]) != self.shape[4:] or len(k) != len(slots):
            raise ValueError(
                f"k/v must be [{len(slots)}, {self.shape[4]}, {self.shape[5]}], "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if self.buffer is None:
            return
        self._layer_view(0, layer)[slots] = self._to_store(k)
        self._layer_view(1, layer)[slots] = self._to_store(v)

    def get_kv(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather K/V of the tokens at `slots` (in that order)."""
        self._check_slots(layer, slots)
        k = self._from_store(self._layer_view(0, layer)[slots])
        v = self._from_store(self._layer_view(1, layer)[slots])
        return k, v


class MLATokenToKVPool(_TokenToKVPool):
    """DeepSeek-style MLA: one latent of `kv_lora_rank + qk_rope_head_dim` per token and layer,
    no K/V pair (the factor 2 disappears, and the latent is not split across TP ranks)."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_layers: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: str = "bf16",
        device: str | torch.device = "cpu",
        store: bool = True,
    ) -> None:
        width = positive_int("kv_lora_rank", kv_lora_rank) + positive_int(
            "qk_rope_head_dim", qk_rope_head_dim
        )
        super().__init__(num_pages, page_size, num_layers, (1, width), 1, dtype, device, store)

    def set_kv(
        self, layer: int, slots: torch.Tensor, latent: torch.Tensor, v: None = None
    ) -> None:
        self._check_slots(layer, slots)
        if v is not None:
            raise ValueError("an MLA pool stores one latent per token; pass v=None")
        if tuple(latent.shape[1:]) != self.shape[4:] or len(latent) != len(slots):
            raise ValueError(f"latent must be [{len(slots)}, 1, {self.shape[5]}]")
        if self.buffer is None:
            return
        self._layer_view(0, layer)[slots] = self._to_store(latent)

    def get_kv(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        self._check_slots(layer, slots)
        return self._from_store(self._layer_view(0, layer)[slots])
