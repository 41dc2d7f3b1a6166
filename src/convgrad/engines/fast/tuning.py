"""The fast engine's tuning table: every threshold and constant of the engine, in one place.

The selection rule (:func:`.plan.default_plan`) and each strategy read their thresholds here; a
:class:`.plan.Plan` carries the parameters a strategy runs with (register block, chunk and
block sizes, thread split, GEMM variant), defaulted from this table. The measurements behind
the values are in docs/engine-measurements.md ("Measurements behind the tuning table"), not here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ...memo import Memo

__all__ = ["Tuning", "TUNING", "remembered"]


def _per_task(forward: float, data: float, weights: float) -> dict[str, float]:
    return {"forward": forward, "backward_data": data, "backward_weights": weights}


@dataclass(frozen=True)
class Tuning:
    """Thresholds and default plan parameters of the fast engine."""

    # -- the selection rule ---------------------------------------------------------------------
    #: Problems of at most this many FLOPs (2*N*OC*ICg*prod(K)*prod(O)) run on the ``direct``
    #: strategy's loops, where the GEMM paths' fixed per-call costs would dominate.
    direct_flops: int = 500_000
    #: ... and those the rule would give to ``gemm`` up to this many FLOPs (its fixed costs,
    #: 150-300 us a call; the ``direct`` loops vectorised over channels). Zen 5, 2026-11-28, the
    #: dilated suite's 0.66-1.02 MFLOP layers, direct / gemm time: weights gradients 0.09-0.18,
    #: f32 data gradients 0.56-0.58; bf16 3x3 weights gradients of 2.4-4.7 MFLOP 0.28-0.39.
    direct_gemm_flops: int = 4_000_000
    #: ``direct``: the general loops' innermost channels (output channels per group; the data
    #: gradient's input channels) from which they fill a vector (AVX-512) and the flat loops'
    #: frames may waste only half ``flat_waste``; weights gradients that wide stay general.
    flat_channels: int = 16
    #: ``direct``: the flat loops run where their frames compute at most this many values per
    #: product needed (:func:`.direct_flat.waste`): narrow channels, Zen 4, 2026-11-26: flat
    #: 3-8x faster at waste 1.2-1.5, 9x slower at a dilated layer's waste of about 25.
    flat_waste: float = 4.0
    #: Kernel families on which the rule selects the ``jit`` strategy: every family with JIT
    #: kernels (``portable`` has none); there, whatever the taps and channels, for bf16 data, NXC
    #: data, and any data where PyTorch's threads share the cores (one pool: no BLAS threads
    #: beside numba's and PyTorch's). Measured in sequence: on a Zen 4, a ResNet-50 training step
    #: f32 1390 -> 1030 ms, bf16 1050 -> 850 ms against the channel limits below; without
    #: PyTorch, ResNet-50's 40 f32 NXC gradients back to back 647-757 ms against 679-805 on the
    #: limits (2026-11-26, four alternating rounds); on a Zen 3 (AVX2, once our GEMM packed A and
    #: B for deep reductions), the f32 step 1371 against 1439 ms with the 3x3 layers above the
    #: limits on BLAS (faster in each of six alternating rounds; PyTorch 1397), bf16 1783 against
    #: 1744 (2026-11-27). NCX f32 without PyTorch keeps the limits (BLAS reads NCX 1x1 layers as
    #: they lie: 626 against 879 ms, Zen 4).
    jit_families: tuple[str, ...] = ("amx_bf16", "avx512_bf16", "avx512", "avx2")
    #: ... and for the other problems, kernels of several taps with at most this many channels
    #: per group on either side, per task ...
    jit_channels: dict[str, float] = field(default_factory=lambda: _per_task(128, 64, 64))
    #: ... for the gradients from this many input channels per group, per task (fewer leave most
    #: lanes of backward data's vectors idle) ...
    jit_min_input_channels: dict[str, float] = field(default_factory=lambda: _per_task(0, 8, 3))
    #: ... a weights gradient of fewer than backward data's only where its register block
    #: computes at most this many FMAs per one kept (``jit.idle``), per (vector width, 512-bit
    #: operations halved: :func:`.isa.halved_vectors`). Zen 4, 2026-11-26, f32, ms (jit / BLAS):
    #: ResNet-50's conv1 (3 -> 64 channels, 3x4 block, idle 1.0) 32 / 39 (bf16 18 / 50); 3 -> 48
    #: channels (7x3, idle 2.3) 24 / 19; 3 -> 32 (14x2, idle 4.7) 263 / 136. Zen 3 (AVX2),
    #: 2026-11-27, conv1 on each block, alternating rounds: 4x3 (idle 1.5) 0.81x BLAS's time
    #: (0.62x in sequence, `convgrad tune`), 6x2 (2.0) 1.01x, 8x1 (2.7) 2.1x. Zen 5 (full-width
    #: AVX-512; NumPy's OpenBLAS on AVX2 kernels there), 2026-11-28, jit / frame GEMMs: idle 2.3-16
    #: f32 0.49-0.86, bf16 0.30-0.83 (3 -> 48 5x5 dilated: 7.8 / 15.6 ms, bf16 5.2 / 17.4).
    jit_narrow_idle: dict[tuple[int, bool], float] = field(default_factory=lambda: {
        (8, False): 1.75, (8, True): 1.75, (16, True): 1.75, (16, False): math.inf})
    #: ``jit``: a weights gradient of fewer input channels per group than this (one group,
    #: dilation 1 along the last axis, not bf16 pairs) reads its last kernel axis' taps as input
    #: channels (``jit.folds``: K2*ICg rows a tap of the other axes). Zen 5, 2026-11-28, f32 mb 16,
    #: folded / not (16 lanes; the avx2 family on the same CPU): 3-D U-Net's conv_1 (3 -> 32,
    #: 3x3x3, mb 1; the frame GEMMs before) 0.21 (0.36), 4 -> 64 3x3 0.76 (0.77), 7 -> 32 3x3
    #: 0.16 (0.63), 1 -> 16 5x5 1.01 (0.19), ResNet-50's conv1 1.00 (0.76).
    fold_channels: int = 8
    #: ... a multi-tap weights gradient not where its output rows hold at most this many
    #: positions, per family (the driver's batch-reduce calls take one output row of positions
    #: as their reduction: 7 at ResNet-50's res5): Zen 3 (AVX2), 2026-11-28, mb 16, two threads,
    #: GFLOP/s jit / the output-row GEMMs / PyTorch: 3x3 512 channels at 7x7 50.7 / 100.5 / 46.3,
    #: 256 at 14x14 70.4 / 94.7 / 72.9 (docs/engine-measurements.md, "sixth session") ...
    jit_weights_short_rows: dict[str, int] = field(default_factory=lambda: {"avx2": 14})
    #: ... and a multi-tap weights gradient only of data already in f32 (its f32 copies of
    #: 16-bit x and dy would exceed the 2x memory bound; pointwise ones stay 16-bit on the GEMM).
    jit_weights_16_bit: bool = False
    #: A gradient whose frame has this many times more rows than outputs (a large dilation on a
    #: small output) runs as GEMMs over the output rows (``gemm`` variant ``output_rows``), not
    #: on ``jit`` nor the frame. Data 1.85, not 1.9: 3-D U-Net's conv_8 (1.87, unpadded 3x3x3)
    #: 40 / 575 ms on jit at mb 1 / 16 against 20 / 275 (Xeon with AMX, f32 NXC, 2026-12-08).
    junk_ratio: dict[str, float] = field(default_factory=lambda: {"backward_data": 1.85, "backward_weights": 1.66})
    #: ... but a junk-heavy f32 gradient beside PyTorch runs on ``jit`` (one pool) where its
    #: temporaries (``jit.workspace_bytes``) are at most this many times the inputs and output:
    #: Zen 5, 2026-11-28, the dilated suite's layers 21-25 10-143 GFLOP/s on the output-row GEMMs
    #: beside PyTorch, 133-332 on jit; dilated_conv:24's weights gradient took 2.18x there.
    junk_memory: float = 2.0
    #: (ICg, OCg) from which a gradient with several taps runs as GEMMs over the output rows
    #: whatever the junk (one wide, or tall, GEMM per chunk instead of one per tap); backward data
    #: also from that ICg where the frame would sum narrow results at their shifts.
    wide_channels: dict[str, tuple[int, int]] = field(default_factory=lambda: {
        "backward_data": (32, 256), "backward_weights": (32, 64)})
    #: Positions per image from which a pointwise layer on NCX data in the accumulation dtype
    #: runs as one GEMM per image (``gemm`` variant ``image_gemms``).
    image_gemm_rows: int = 128

    #: A ``gemm`` call of at least this many FLOPs (about a millisecond on BLAS) stops
    #: OpenBLAS's spinning threads when it ends (:func:`.pool.quiet_blas`, 60-110 µs): they
    #: halved the next calls on numba's threads (docs/engine-measurements.md, "OpenBLAS spinning").
    quiet_blas_flops: int = 100_000_000
    #: ... a smaller one only before the next call on numba's threads within this many seconds
    #: (OpenBLAS's threads spin 2^28 cycles, about 70 ms, after a call): the 1-D suite's calls
    #: back to back, f32, 140 -> 60-68 ms NXC, 124-139 -> 110-112 NCX (Xeon with AMX, 2026-12-08).
    blas_spin_seconds: float = 0.1
    #: ... and numba's OpenMP threads spin this many rounds after a parallel region before they
    #: sleep (``GOMP_SPINCOUNT`` of the libgomp numba loads, where neither it nor
    #: ``OMP_WAIT_POLICY`` is set; libgomp's own: 300,000, ~7 ms on a Zen 5): spinning that long
    #: beside a BLAS call slowed it (ResNet-50's conv1 data gradient 33 -> 40 ms right after a
    #: ``jit`` call, Zen 5, 2026-11-28; ResNet-50's 40 calls in sequence 1.07-1.10x the sum of
    #: each alone, 1.01-1.04x with 30,000).
    omp_spin_count: int = 30_000

    #: Problems whose chosen plan :func:`.plan.planned` remembers for repeated calls (then it
    #: starts afresh).
    planned_entries: int = 1024

    # -- default plan parameters ----------------------------------------------------------------
    #: The register block's time per computed position is taken as 1 + this x its loads per FMA
    #: (``microkernel.block_for``), per vector width: 16 fitted on a Zen 4's 3x3 layers, where
    #: 14x2 (0.57 loads per FMA) computing no padding columns ran 1.5 % slower than 6x4 (0.42)
    #: computing 3.6 % more; 8 on a Zen 3's (AVX2): 4x3 (0.58) over 6x2 (0.67) from 256 channels.
    block_loads_weight: dict[int, float] = field(default_factory=lambda: {8: 1.0, 16: 0.39})
    #: ... and for AMX tile blocks (:func:`.microkernel.tile_block_for`), per operand tile loaded per tile
    #: product: not fitted yet (a Sapphire Rapids' probe, docs/engine-measurements.md "AMX tiles,
    #: measured", ranked 32x2 (one load a product) first at 256 pairs a call, 836 GFLOP/s on a
    #: core, against 317-427 for the 16-row blocks); 0.25 keeps whole tiles of lanes first.
    tile_loads_weight: float = 0.25
    #: The bf16 weights gradient on tiles (:mod:`.tap_gemm`): a chunk of positions' A (x^T, with
    #: its halo) and B (dy's pairs) take this share of the L2 ...
    tap_gemm_l2: float = 0.5
    #: ... and the threads keep partial sums of dw each (sharing the chunks) while these take at
    #: most this times the bf16 x and dy (else they share dw's blocks).
    tap_gemm_partials: float = 1.0
    #: ... folding the last kernel axis into the channels where that fills at least this many
    #: times the tile rows (:func:`.tap_gemm.folded`; ResNet-50's conv1, 3 channels, 7x7: see
    #: docs/engine-measurements.md, Xeon 2026-12-07, second session).
    tap_gemm_fold: float = 2.0
    #: ... and for our GEMM's blocks (:func:`.blis.register_block`) and the weights gradient's on
    #: every width: on the Zen 3 the 1x1 layers of 256 output channels ran 25 % slower on 4x3 than
    #: on 6x2, the 3x3 weights gradients were within noise at 256 channels and 0-20 % slower at 512.
    gemm_loads_weight: float = 0.39
    #: ... and a result whose columns a block leaves padded costs a copy of about this many FMAs
    #: per value (``blis.register_block``: weighed against the reduction's depth). Zen 3, 2
    #: threads: ResNet-50's res5a_branch1 weights gradient at mb 1 (1024 x 49 x 2048, 4x3 block:
    #: 24 lanes do not divide 2048) 4.9 ms in the GEMM, 2.2 more copying its 8 MB result out.
    gemm_result_copy: float = 16.0
    #: ``jit``: bytes of operands meant to stay in a core's L2 cache: the weights gradient reduces
    #: over chunks of output rows of about this much x and dy; forward and backward data loop over
    #: the channel blocks outermost where the packed weights take more than this or the host's L2
    #: (the larger: on a Zen 4's 1 MiB L2 the 128-channel 3x3 layers ran 14-22 % faster with their
    #: 590 KB of weights inner than outer).
    cache_bytes: int = 256 << 10
    #: ``jit``: bytes of the bf16 pair copies of x and dy (the weights gradient on the dot
    #: instruction) per call, a few images at a time (keeps the extra memory under 2x).
    pair_bytes: int = 4 << 20
    #: ``jit``: bf16 pairs of x for the weights gradient are joined by a loop compiled for the
    #: channel count below this many channels per group (unrolled; Zen 5, 2026-11-28, conv1's 3
    #: channels: 0.227 -> 0.10 ms an image), by one loop over any count from it.
    pair_fill_channels: int = 8
    #: ``jit``: bytes of the padded f32 copy of 16-bit data read as f32 (f16; bf16 off the dot
    #: product) in forward and backward data, a few images at a time (keeps the extra memory
    #: under 2x).
    widened_bytes: int = 2 << 20
    #: ``jit``: the weights gradient splits dw's blocks among the threads (each over all
    #: positions) where dw has more than this times the values of x and dy together, else the
    #: output positions (a partial dw per thread, then summed).
    weights_split: float = 0.25
    #: ``jit``: forward and backward data cut each flattened row of positions into runs of whole
    #: register blocks until there are at least this many items of work per thread (one image
    #: flattened was one item: mb 1 ran on one thread).
    items_per_thread: int = 4
    #: ``gemm``: bytes of per-chunk temporaries (frame buffers, or the output-row GEMMs' Z or
    #: gathered taps); a chunk also takes at most half the op's inputs + output, but is never
    #: cut below ``min_chunk_bytes`` for that; at least one image.
    chunk_bytes: int = 16 << 20
    min_chunk_bytes: int = 1 << 20
    #: ``gemm``: bytes of one row-block operand of the frame's GEMMs (about a core's L2).
    block_bytes: int = 2 << 20
    #: ``gemm``: bytes of the f32 row buffers of the 16-bit pointwise GEMMs (input and output rows).
    pointwise_block_bytes: int = 4 << 20
    #: ``gemm``: row blocks have at least this many rows, whatever ``block_bytes`` says.
    min_block_rows: int = 256
    #: ``direct``: the depthwise weights gradient sums this many partial dw per thread (Zen 5,
    #: 2026-11-28, MobileNet's layers at 2 / 4 parts, in one process: f32 geomean 0.975, 0.996,
    #: 0.975 in three runs (conv5_1 / conv6 0.92-0.98); bf16 0.985; 1 part 1.07-1.31x on the
    #: 7x7-28x28 layers).
    depthwise_parts_per_thread: int = 2
    #: ``direct``: the depthwise forward and data gradient run this many chunks of rows per thread
    #: (2 instead: MobileNet's data gradients 0.99-1.12x the time on the same Zen 5).
    depthwise_chunks_per_thread: int = 4
    #: ``direct``: the depthwise kernels start their blocks of channels on a vector boundary of
    #: the data from this many vectors of channels (one more call per row for the channels
    #: before it; :func:`.depthwise._aligns`). Zen 5, MobileNet's layers on data 16 bytes past a
    #: line (NumPy's), new / old time: 256-1024 channels, weights gradient 0.78-0.94, forward
    #: 0.80-0.89, unit-stride data gradient 0.79-0.96 (strided: 1.27, not aligned); 32-128
    #: channels 0.99-1.25.
    depthwise_align_vectors: int = 16
    #: ``direct``: the depthwise forward and data gradient store a result of at least this share
    #: of the L3 cache past the caches (non-temporal stores; :func:`.depthwise._streams`). Zen 5,
    #: MobileNet mb 16, new / old time: results of 12.8-51 MB 0.60-0.97 (conv2_1 2.46 -> 1.47
    #: ms); of 3.2-6.4 MB 0.81-1.70 (strided data gradients slowest): left in the caches.
    depthwise_stream_l3: float = 0.25
    #: A strided 1x1 data gradient's dx (zero between the positions its GEMM wrote) of at least
    #: this many bytes (twice two cores' L2) is stored past the caches (:func:`.geometry.spread`).
    #: Xeon with AMX, 2026-12-07, f32, stride 2: dx of 51 / 26 / 13 MB 3.5 -> 1.5, 1.5 -> 0.7,
    #: 0.96 -> 0.37 ms (the whole call 7.2 -> 5.1, 4.3 -> 4.0, 4.3 -> 3.7 ms).
    spread_stream_bytes: int = 8 << 20
    #: ``direct``: vectors of channels (at most; a power of two) of a one-position block of the
    #: depthwise forward and data gradient kernels, per vector width (:func:`.depthwise_kernels.gather_block`;
    #: 1: blocks of positions of one vector). Zen 3 (AVX2), MobileNet's data gradients, 2026-11-27:
    #: 1.2-2.6x faster than 7-8 positions of one vector; Zen 4's 16-wide blocks as measured there.
    gather_vectors: dict[int, int] = field(default_factory=lambda: {8: 4, 16: 1})
    #: Temporaries of at least this many bytes come from the engine's cache (``workspace``) ...
    workspace_min_bytes: int = 1 << 20
    #: ... which keeps at most this many bytes of them from one call to the next (ResNet-50's 40
    #: bf16 gradients at mb 16 leave 63 MB there).
    workspace_cache_bytes: int = 256 << 20

    # -- our GEMM (``blis``) ----------------------------------------------------------------------
    #: Register block (rows, vectors) of our GEMM per (vector width, operand bytes, 512-bit
    #: operations halved: :func:`.isa.halved_vectors`), where the output has that many vectors;
    #: elsewhere the fewest idle lanes and loads (``microkernel.block_for``). A Zen 4 (halved) ran
    #: f32 on 14x2 up to 1.4x faster than 6x4; a Zen 5 (full width, 2026-11-28) 6x4 as fast or
    #: faster: x^T @ dy 64 x 50176 x 64 344 against 298 GFLOP/s, 50176 x 256 x 64 497 / 354.
    gemm_blocks: dict[tuple[int, int, bool], tuple[int, int]] = field(default_factory=lambda: {
        (16, 4, True): (14, 2)})
    #: L1 caches' worth of bytes of one B micro-panel (kc x nr), per vector width: sets kc. A Zen 3
    #: (AVX2, 2026-11-27, our GEMM forced): ResNet-50's 1x1 weights gradients (K = positions) of
    #: stages 2-4 at 0.5 / 1 / 2: 147 / 171 / 218 ms in all, their forward and data gradients the
    #: same at each (124 / 120 / 119, 109 / 108 / 110); the Zen 4's measurements set 2.
    #: Per (vector width, 512-bit operations halved: :func:`.isa.halved_vectors`); a Zen 5 (full
    #: width, 48 KiB L1), 2026-11-28, 2 -> 3 L1s (kc 384 -> 576): ResNet-50's 1x1 data gradients
    #: 0.95-1.00x the time (f32 and bf16; res3a_branch2c's K of 512 in one step: 0.95).
    gemm_panel_l1: dict[tuple[int, bool], float] = field(default_factory=lambda: {
        (8, False): 0.5, (8, True): 0.5, (16, True): 2.0, (16, False): 3.0})
    #: ``gemm_panel_l1`` of a deep reduction (:func:`.blis.deep`: the weights gradients), whose A
    #: (x^T or dy^T) is packed per K step with one cache line of a block's rows per step: kc
    #: such lines and the B micro-panel share the L1 (docs/engine-measurements.md, "Zen 3,
    #: 2026-11-27, sixth session"; 16 lanes: a Zen 5's 48 KiB L1, 2026-11-28, f32 x^T @ dy of
    #: 256 x 50176 x 64 at 1 / 2 L1s: 405 / 276 GFLOP/s, bf16 the same or better at 1). Per
    #: family: on the Xeon with AMX (48 KiB L1, 2026-12-07) A packed (``gemm_pack_stride``) and
    #: 3/8 of the L1 (kc 64): ResNet-50's f32 1x1 weights GEMMs 172-269 -> 251-280 GFLOP/s.
    gemm_deep_panel_l1: dict[str, float] = field(default_factory=lambda: {
        "avx2": 0.25, "avx512": 1.0, "avx512_bf16": 1.0, "amx_bf16": 0.375})
    #: A GEMM reducing over K > this times (M + N) (a weights gradient) splits K among the threads.
    gemm_deep: float = 4.0
    #: A B stored along K (a data gradient's transposed weights) with at least this many times
    #: A's rows as columns runs as ``(B^T A^T)^T``: B read in place, A packed (Zen 4, ResNet-50's
    #: res5 1x1 data gradients at mb 1); bf16 also only with this many times A's rows along K,
    #: measured while NumPy transposed its result (the Xeon with AMX, mb 1: 1024 -> 256 channels at
    #: 14x14 280 -> 174 µs unswapped, 2048 -> 512 at 7x7 304 swapped against 388). 8, not 4: f32
    #: on the Xeon with AMX, mb 1, 1024 -> 256 channels at 14x14 (5.2 times) 0.86-0.92 ms swapped
    #: against 0.55; the res5 layers (10-42 times) 0.41-1.19 swapped against 0.60-1.79.
    gemm_swap_ratio: int = 8
    #: An f32 A that steps at least this many values per K step (x^T of as many channels: 2 KB, a
    #: K step's values in two L1 sets) is packed per block of rows and K step, as bf16 is; nearer
    #: ones are read as they lie: per family (AVX-512 on a Zen 4: packing cost 10-25 % at 64-256
    #: channels, 2026-11-26; AVX2 always packed, ResNet-50's 1x1 weights gradients 313 -> 215 ms on
    #: two threads of a Zen 3, 2026-11-27; AMX, the Xeon: always packed, see ``gemm_deep_panel_l1``:
    #: read in place, a kernel call's A lines and B panel passed the L1).
    gemm_pack_stride: dict[str, int] = field(default_factory=lambda: {
        "avx2": 1, "avx512": 512, "avx512_bf16": 512, "amx_bf16": 1})
    #: A deep reduction split along K among the threads reads an f32 B of whole panels in place,
    #: per vector width (16: packing it was a pass over the larger operand, Zen 4; 8: packed,
    #: ResNet-50's 1x1 weights gradients 344 -> 265 ms on two threads of a Zen 3, 2026-11-27).
    gemm_deep_b_in_place: dict[int, bool] = field(default_factory=lambda: {8: False, 16: True})
    #: A read in place whose rows lie this many bytes or more apart (x of 256 or more f32
    #: channels) is copied per K step and block of rows at a stride off the page size.
    gemm_copy_rows: int = 1024
    #: The threads' split of a GEMM may leave the busiest thread this much more work than the
    #: best split would, for fewer (larger) items of work.
    gemm_balance: float = 0.01

    # -- inside the ``gemm`` strategy -----------------------------------------------------------
    #: Reduction depth (taps x channels) from which one GEMM runs near BLAS speed: below it the
    #: frame gathers several taps per GEMM (a blocked im2col).
    gemm_depth: int = 64
    #: The frame's weights gradient takes one tap per GEMM on views from this many input channels.
    reduce_views: int = 32
    #: Gathered taps x channels (output rows of the GEMM) of the weights gradient of narrow inputs.
    reduce_depth: int = 256
    #: The frame's narrow-output sums take blocks of this many ``block_bytes``.
    spread_blocks: int = 8
    #: Up to this many groups the GEMMs run group by group through BLAS's ``beta = 1`` GEMM;
    #: more go to ``np.matmul`` as one batch.
    blas_groups: int = 8
    #: (at most ICg, at least OCg) of a multi-tap backward data whose products of dy's own rows
    #: are scattered into the phase buffers (a first layer: few image channels from many).
    scatter_channels: tuple[int, int] = (4, 32)
    #: Output rows per output channel up to which the output-row weights gradient of NCX data
    #: sums dw in OIX memory order (taps innermost) instead of transposing an XIO dw.
    oix_rows: int = 8
    #: NCX 1x1 layers whose copied data (x; dy for a data gradient) holds fewer positions per
    #: image than this, by item size, run on NXC copies of it (transposed in register tiles),
    #: else one GEMM per image. ResNet-50's 1x1 gradients, mb 16, Xeon with AMX: f32 at 196 and
    #: 49 positions 0.59-0.84x the per-image time, at 784 1.13-1.36x; bf16 at 784 and fewer
    #: 0.28-0.88x, at 3136 0.71-1.62x (docs/engine-measurements.md).
    ncx_transposed_positions: dict[int, int] = field(default_factory=lambda: {4: 256, 2: 1024})
    #: Bytes of a weights result from which its reversal into OIX/IOX memory runs in the pool
    #: (serial / pooled on the Xeon with AMX: 16 KiB 6.0 / 8.2 µs, 37 KiB 8.6 / 8.8, 147 KiB 24 / 12).
    reversed_weights_bytes: int = 1 << 16


TUNING = Tuning()


def remembered(table: Callable[[], Tuning]) -> Callable[[Callable], Callable]:
    """A decorator: the function remembered per its (hashable) arguments and the tuning table
    ``table()`` returns at the call (a module's ``TUNING``: a value made under a test's replaced
    table is made again), in a :class:`convgrad.memo.Memo` of 1024 entries. What a small call's
    Python would compute again each time (``cache_clear`` forgets)."""
    def decorate(fn: Callable) -> Callable:
        memo: Memo[tuple, tuple[Tuning, object]] = Memo(1024)

        @functools.wraps(fn)
        def remember(*args: object) -> object:
            now, hit = table(), memo.get(args)
            if hit is None or hit[0] is not now:
                hit = memo.put(args, (now, fn(*args)))
            return hit[1]
        remember.cache_clear = memo.clear  # type: ignore[attr-defined]
        return remember
    return decorate
