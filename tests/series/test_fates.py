"""The one judge of fates (series.fates): what each pair of statuses, pin and release, makes,
and what lets a fix that stops applying through."""

from __future__ import annotations

import pytest

from patchkit.kinds import Remains
from patchkit.manifest import Retired
from patchkit.report import Status
from patchkit.series.fates import Change, Proof, judge

A, U, S, F = Status.APPLIED, Status.UPSTREAM, Status.SKIPPED, Status.FAILED


def fate(pin, at, **kw):
    return judge("fix", pin, at, ref="v2", pin_ref="v1", **kw)


@pytest.mark.parametrize("pin, at, change", [
    (A, A, Change.UNCHANGED), (S, S, Change.UNCHANGED), (U, U, Change.UNCHANGED),
    (A, U, Change.NOW_UPSTREAM), (S, A, Change.NEWLY_APPLIED), (U, A, Change.NEWLY_APPLIED),
    (A, S, Change.LOST), (A, None, Change.LOST), (A, F, Change.FAILED), (S, F, Change.FAILED),
])
def test_each_pair_of_statuses(pin, at, change):
    assert fate(pin, at).change is change


def test_lost_names_the_patch_and_both_releases():
    f = fate(A, S)
    assert f.lost and f.fails
    assert f.why == ("fix took effect at v1 and not at v2 (skipped): it is not upstream there, "
                     "no patch that takes effect there supersedes it, and it is not retired")


def test_what_lets_a_fix_that_stops_through():
    assert fate(A, S, upstream=True).change is Change.NOW_UPSTREAM     # a port marked it
    assert fate(A, S, successor="fix-v2").why == "superseded by fix-v2"
    assert fate(A, U, made_by="first").change is Change.MADE_BY         # never "upstream"
    assert fate(A, S, older=True).change is Change.NOT_YET              # a look back is no loss
    assert not fate(A, S, older=True).fails and not fate(A, S, older=True).noted


def proof(still=(), gone=()):
    return Proof("fix", Retired("v2", "it is gone"), "v2", Remains(tuple(still), tuple(gone)))


def test_a_retirement_counts_only_with_its_proof():
    ok = fate(A, S, proof=proof(gone=["pkg/a.py is gone"]))
    assert ok.change is Change.RETIRED and not ok.fails
    assert ok.why == "retired from v2 (it is gone); proven at v2: pkg/a.py is gone"
    refused = fate(A, S, proof=proof(still=["pkg/a.py still has `x = 1` (hunk 1)"]))
    assert refused.change is Change.REFUSED and refused.fails
    assert refused.why == ("fix is retired from v2, but v2 still has its code: pkg/a.py still "
                           "has `x = 1` (hunk 1)")
    # nothing gone and nothing still there proves nothing
    assert fate(A, S, proof=proof()).change is Change.REFUSED
