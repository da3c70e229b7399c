"""Edge behaviour of vlforge.patch: auto-precision size buckets, and a warning when nothing matches."""

from __future__ import annotations

import torch

import vlforge
from vlforge.patches import auto


def test_new_patch_counts_in_one_bucket_reuse_one_measurement() -> None:
    auto.clear_auto_cache()
    conv = torch.nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4))
    vlforge.patch(conv, precision="auto")
    with torch.no_grad():
        for windows in (100, 101, 102, 127):
            reference = conv._conv_forward(torch.ones(windows, 3, 2, 4, 4), conv.weight, conv.bias)
            assert torch.allclose(conv(torch.ones(windows, 3, 2, 4, 4)), reference, atol=1e-5)
        assert len(auto._AUTO_CHOICES) == 1
        conv(torch.ones(129, 3, 2, 4, 4))
    assert len(auto._AUTO_CHOICES) == 2
    assert auto.shape_bucket((6080, 3, 2, 16, 16)) == (8192, 4, 2, 16, 16)
    auto.clear_auto_cache()


def test_patching_a_model_without_a_patch_conv_warns(caplog) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="vlforge")
    report = vlforge.patch(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Conv2d(3, 3, 3)))
    assert len(report) == 0
    assert any("nothing patched" in record.getMessage() for record in caplog.records)
