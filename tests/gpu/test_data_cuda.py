"""The CUDA half of the input pipeline: nvjpeg batch decoding, the side-stream loader, and the
profiler's CUDA events. Skipped without CUDA."""

from __future__ import annotations

import io
import time

import pytest
import torch

from ringtrain.data.gpu_decode import EncodedImages, GpuDecoder
from ringtrain.data.image_folder import ImageFolder
from ringtrain.data.jpeg import decode_jpeg_cuda, decode_rgb
from ringtrain.data.loader import DeviceLoader
from ringtrain.data.tuning import LoaderSettings
from ringtrain.torch.step_profiler import StepProfiler
from tests.data.images import make_folder, photo

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_nvjpeg_batch_matches_the_cpu_decoder():
    blobs = []
    for seed in range(3):
        buf = io.BytesIO()
        photo(seed, 64 + 16 * seed, 48).save(buf, "JPEG", quality=95)
        blobs.append(buf.getvalue())
    decoded = decode_jpeg_cuda([torch.frombuffer(bytearray(b), dtype=torch.uint8)
                                for b in blobs], "cuda")
    for blob, image in zip(blobs, decoded):
        cpu = torch.from_numpy(decode_rgb(blob)).permute(2, 0, 1)
        assert image.is_cuda and image.shape == cpu.shape
        assert (image.cpu().int() - cpu.int()).abs().float().mean() < 3


def test_gpu_decoding_loader_gives_normalised_batches_on_the_device(tmp_path):
    folder = ImageFolder(make_folder(tmp_path / "train", classes=2, per_class=4))
    loader = DeviceLoader(EncodedImages(folder), 4, device="cuda",
                          settings=LoaderSettings(1, 2, "test"), channels_last=True,
                          decoder=GpuDecoder("cuda", 32))
    batches = list(loader)
    assert len(batches) == 2
    images, labels = batches[0]
    assert images.is_cuda and labels.is_cuda and images.shape == (4, 3, 32, 32)
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_profiler_times_cuda_phases_with_events():
    model = torch.nn.Linear(1024, 1024).cuda()
    profiler = StepProfiler("cuda", metrics_dir=False, rank=0)
    x = torch.randn(512, 1024, device="cuda")
    t0 = time.perf_counter()
    for _ in profiler.iterate(range(20)):
        with profiler.phase("forward_backward"):
            for _ in range(10):
                model(x).sum().backward()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 20 * 1e3
    profiler.close()
    s = profiler.summary()
    assert s["steps"] == 20 and s["forward_backward_ms"] > 0
    assert abs(s["step_ms"] - wall) < 0.1 * wall + 0.5
