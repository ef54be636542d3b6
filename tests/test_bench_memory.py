"""The bench's memory breakdown: each phase's peak RSS, taken inside the phase it names."""

import mmap

from musketeers.bench.memory import PhasePeaks, rss_mib
from musketeers.bench.rounds import merged
from musketeers.runtime.step_profile import PhaseClock


def test_a_phase_that_allocates_peaks_above_the_others():
    clock = PhaseClock()
    with PhasePeaks(interval_s=0.001) as peaks:
        with clock.phase("sample"):
            pass
        with clock.phase("forward"):
            # 64 MiB of fresh anonymous pages, each written so resident: a tensor could reuse
            # pages a long test process already holds, and then RSS would not rise
            big = mmap.mmap(-1, 64 * 2**20)
            for at in range(0, len(big), mmap.PAGESIZE):
                big[at] = 1
            peaks.note()
            big.close()
        with clock.phase("backward"):
            pass
    assert set(peaks.peaks) >= {"load", "sample", "forward", "backward"}
    assert peaks.peaks["forward"] - peaks.peaks["sample"] > 48
    assert peaks.peaks["backward"] < peaks.peaks["forward"]
    with clock.phase("reference"):  # outside the block, no longer observed
        pass
    assert "reference" not in peaks.peaks
    assert rss_mib() > 0


def test_merged_rounds_keep_each_phase_largest_peak():
    rounds = [{"step_s": [1.0], "peak_rss_mib": 5.0, "phase_peak_rss_mib": {"sample": 3.0}},
              {"step_s": [2.0], "peak_rss_mib": 7.0,
               "phase_peak_rss_mib": {"sample": 2.0, "forward": 6.0}}]
    assert merged(rounds)["phase_peak_rss_mib"] == {"sample": 3.0, "forward": 6.0}
