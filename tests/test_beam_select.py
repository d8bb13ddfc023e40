"""beam_search.select on hand-made log-probabilities: a candidate the grammar forbids
(-inf) never becomes a beam nor a finished hypothesis (issue 29 item 8)."""

from types import SimpleNamespace

import numpy as np

from rawpage.beam_search import BeamState, select

EOS = 0


def beam(cum: float):
    return SimpleNamespace(cumulative_logprob=cum, output_token_ids=[5], num_tokens=4)


def test_a_grammar_that_allows_one_token_keeps_one_beam_per_parent():
    st = BeamState(width=3, length_penalty=1.0, early_stopping=False)
    lp = np.full((2, 10), -np.inf)
    lp[0, 7] = lp[1, 8] = 0.0  # each beam's grammar allows one token
    chosen = select(st, [beam(-1.0), beam(-2.0)], lp, {EOS}, ignore_eos=False)
    assert [(tok, lp_) for _, tok, lp_ in chosen] == [(7, 0.0), (8, 0.0)]  # two beams, not three
    assert st.finished == []


def test_a_forbidden_eos_is_no_hypothesis_and_nothing_allowed_is_no_beam():
    st = BeamState(width=2, length_penalty=1.0, early_stopping=False)
    lp = np.full((1, 10), -np.inf)
    assert select(st, [beam(-1.0)], lp, {EOS}, ignore_eos=False) == []
    assert st.finished == []
