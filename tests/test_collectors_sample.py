"""Samples as the ring holds them: links packed (LinkRates), few objects for the garbage collector."""

from __future__ import annotations

import gc
import pickle

import pytest

from collectors.sample import GpuSample, LinkRates, LinkSample


def test_link_rates_read_back_as_link_samples_with_none_kept() -> None:
    links = [LinkSample(0, 1e9, None), LinkSample(3, None, 2.5e9), LinkSample(17, 0.0, 0.0)]
    packed = LinkRates(links)
    assert list(packed) == links and packed == links and len(packed) == 3
    assert packed[1] == LinkSample(3, None, 2.5e9) and packed[-1] == links[-1] and packed[:2] == links[:2]
    with pytest.raises(IndexError):
        packed[3]
    packed.append((5, 1.0, 2.0))
    assert packed[3] == LinkSample(5, 1.0, 2.0)
    assert pickle.loads(pickle.dumps(packed)) == packed
    assert max(link.link for link in packed) == 17 and bool(LinkRates()) is False


def test_a_sample_passes_its_links_on_packed() -> None:
    sample = GpuSample(ts=1.0, gpu=0, links=[LinkSample(link, 1e9, 2e9) for link in range(18)])
    assert isinstance(sample.links, LinkRates) and sample.links[17] == LinkSample(17, 1e9, 2e9)


def test_a_sample_with_eighteen_links_is_three_objects_for_the_collector() -> None:
    # The dashboard's ring holds 36,000 samples: one object per link made the collector's full
    # passes walk ~700,000 objects (pauses of ~280 ms on a 2-core box).
    gc.collect()
    before = len(gc.get_objects())
    samples = [GpuSample(ts=float(i), gpu=i % 8, links=[LinkSample(link, 1e9, 2e9) for link in range(18)])
               for i in range(1000)]
    gc.collect()
    tracked = len(gc.get_objects()) - before
    assert tracked <= 3 * len(samples) + 50, tracked
