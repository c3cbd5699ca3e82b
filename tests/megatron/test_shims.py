"""One test per shim of ``xconf/adapters/megatron/shims.py``: each shows the Megatron call it
covers failing (or needing it) without the shim, and doing the right thing with it."""

from __future__ import annotations

import pytest
import torch

from tests.megatron.conftest import needs_megatron

pytestmark = needs_megatron
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="shows the failure without CUDA")


@no_cuda
def test_rotary_embedding_stays_on_the_cpu() -> None:
    """``RotaryEmbedding.get_emb`` moves ``inv_freq`` to ``torch.cuda.current_device()`` at
    its first call: without CUDA that raises; under the shim it computes on the CPU, the
    frequencies of the RoPE definition."""
    from xconf.adapters.megatron.shims import cpu_current_device, import_megatron

    import_megatron()
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, use_cpu_initialization=True)
    with pytest.raises((RuntimeError, AssertionError)):
        rope.get_emb(4)
    with cpu_current_device():
        emb = rope.get_emb(4)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    freqs = torch.outer(torch.arange(4, dtype=torch.float32), inv)
    assert emb.device.type == "cpu"
    assert torch.equal(emb[:, 0, 0, :], torch.cat([freqs, freqs], dim=-1))
    assert torch.cuda.current_device is not None and not _patched()


def _patched() -> bool:
    from xconf.adapters.megatron import shims

    return torch.cuda.current_device is shims._cpu


@no_cuda
def test_global_memory_buffer_allocates_on_the_cpu() -> None:
    """``GlobalMemoryBuffer.get_tensor`` (the attention matmul buffer) allocates on the
    current CUDA device: under the shim, on the CPU; the shim is gone after the block."""
    from xconf.adapters.megatron.shims import cpu_current_device, import_megatron

    import_megatron()
    from megatron.core.utils import GlobalMemoryBuffer

    with pytest.raises((RuntimeError, AssertionError)):
        GlobalMemoryBuffer().get_tensor((2, 3), torch.float32, "mpu")
    with cpu_current_device(), cpu_current_device():  # re-entrant
        got = GlobalMemoryBuffer().get_tensor((2, 3), torch.float32, "mpu")
        assert _patched()
    assert got.device.type == "cpu" and got.shape == (2, 3)
    assert not _patched()


@no_cuda
def test_inference_rng_tracker_needs_no_cuda_generator() -> None:
    """``model_parallel_cuda_manual_seed`` seeds CUDA generators (fails without CUDA); the
    inference tracker's fork touches no generator, the CPU one included."""
    from xconf.adapters.megatron.shims import import_megatron, inference_rng_tracker

    import_megatron()
    from megatron.core.tensor_parallel import random

    random.initialize_rng_tracker(force_reset=True)  # a CUDA tracker, as training sets up
    with pytest.raises((RuntimeError, AssertionError, AttributeError)):
        random.model_parallel_cuda_manual_seed(0, tp_rank=0, ep_rank=0, etp_rank=0)
    inference_rng_tracker()
    tracker = random.get_cuda_rng_tracker()
    assert tracker.is_inference_rng_tracker
    before = torch.get_rng_state()
    with tracker.fork():
        pass
    assert torch.equal(before, torch.get_rng_state())


def test_memory_buffer_is_made_once() -> None:
    from xconf.adapters.megatron.shims import import_megatron, memory_buffer

    import_megatron()
    from megatron.core import parallel_state

    memory_buffer()
    first = parallel_state.get_global_memory_buffer()
    memory_buffer()
    assert parallel_state.get_global_memory_buffer() is first


def test_a_world_exists_only_inside_the_block_unless_launched() -> None:
    """Megatron's layers need an initialised torch.distributed: outside a launched world the
    block gets a one-rank gloo world, gone after it; a launched world is left alone."""
    import torch.distributed as dist

    from xconf.adapters.megatron.shims import one_rank_group, torch_distributed

    assert not dist.is_initialized()
    with torch_distributed():
        assert dist.is_initialized() and dist.get_world_size() == 1
        with torch_distributed():  # re-entrant: the inner block leaves the world alone
            pass
        assert dist.is_initialized()
    assert not dist.is_initialized()
    group = one_rank_group()  # needs no world at all
    t = torch.ones(3)
    group.allreduce([t]).wait()
    assert (group.size(), group.rank(), t.tolist()) == (1, 0, [1.0, 1.0, 1.0])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        world = dist.group.WORLD
        with torch_distributed():
            assert dist.group.WORLD is world
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_unfused_cross_entropy_reads_the_model_group() -> None:
    """Megatron's unfused ``vocab_parallel_cross_entropy`` asks ``parallel_state`` for its TP
    group (uninitialised here: it fails); for the call it is the given group, and what
    ``parallel_state`` held before is back after."""
    from xconf.adapters.megatron.shims import (
        import_megatron,
        one_rank_group,
        tensor_parallel_state,
        torch_distributed,
    )

    import_megatron()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = torch.randn(5, 1, 11)
    target = torch.randint(0, 11, (5, 1))
    group = one_rank_group()
    with torch_distributed():
        with pytest.raises(AssertionError):
            vocab_parallel_cross_entropy(logits.clone(), target)
        with tensor_parallel_state(group):
            assert parallel_state.get_tensor_model_parallel_group() is group
            loss = vocab_parallel_cross_entropy(logits.clone(), target)
    assert parallel_state._TENSOR_MODEL_PARALLEL_GROUP is None
    want = -logits.log_softmax(-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(loss, want, rtol=0, atol=1e-6)
