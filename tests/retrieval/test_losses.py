"""Retrieval losses against direct per-row computations (softmax written out with exp / sum)."""

from __future__ import annotations

import math

import pytest
import torch

from ctrkit.retrieval.losses import full_softmax_loss, in_batch_softmax_loss, sampled_softmax_loss


def _ce(logits: list[float], target: int) -> float:
    """-log softmax(logits)[target], skipping -inf entries, by hand."""
    m = max(x for x in logits if x != -math.inf)
    z = sum(math.exp(x - m) for x in logits if x != -math.inf)
    return -(logits[target] - m - math.log(z))


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(sum(float(x) * float(y) for x, y in zip(a, b)))


@pytest.mark.parametrize("log_q, weighted", [(False, False), (True, False), (True, True)])
def test_in_batch_softmax_matches_direct(log_q, weighted):
    g = torch.Generator().manual_seed(0)
    B, D, tau = 7, 5, 0.3
    q, v = torch.randn(B, D, generator=g), torch.randn(B, D, generator=g)
    ids = torch.tensor([3, 5, 3, 9, 11, 5, 3])  # duplicates of the positives: masked
    share = {3: 0.3, 5: 0.2, 9: 0.05, 11: 0.01}
    lq = torch.tensor([math.log(share[int(i)]) for i in ids]) if log_q else None
    w = torch.rand(B, generator=g) + 0.5 if weighted else None
    got = in_batch_softmax_loss(q, v, ids, temperature=tau, log_q=lq, weights=w)
    per_row = []
    for i in range(B):
        row = []
        for j in range(B):
            if j != i and ids[j] == ids[i]:
                row.append(-math.inf)
                continue
            s = _dot(q[i], v[j]) / tau
            row.append(s - (math.log(share[int(ids[j])]) if log_q else 0.0))
        per_row.append(_ce(row, i))
    ws = [float(x) for x in w] if weighted else [1.0] * B
    want = sum(c * x for c, x in zip(per_row, ws)) / sum(ws)
    assert float(got) == pytest.approx(want, rel=1e-5)


def test_in_batch_log_q_lowers_popular_items_pull():
    """With the correction, a popular in-batch negative is discounted: the loss of a row facing it drops."""
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    v = torch.tensor([[1.0, 0.0], [0.9, 0.1]])
    ids = torch.tensor([2, 3])
    row0 = torch.tensor([1.0, 0.0])  # the loss of row 0 (item 2) only; its negative is the popular item 3
    plain = in_batch_softmax_loss(q, v, ids, weights=row0)
    popular_3 = torch.log(torch.tensor([0.01, 0.9]))
    corrected = in_batch_softmax_loss(q, v, ids, log_q=popular_3, weights=row0)
    assert corrected < plain


@pytest.mark.parametrize("log_q", [False, True])
def test_sampled_softmax_matches_direct(log_q):
    g = torch.Generator().manual_seed(1)
    B, K, D, tau = 5, 6, 4, 0.5
    q, vp, vn = torch.randn(B, D, generator=g), torch.randn(B, D, generator=g), torch.randn(K, D, generator=g)
    pos = torch.tensor([2, 4, 6, 8, 10])
    neg = torch.tensor([4, 3, 10, 12, 2, 5])  # 4, 10 and 2 are accidental hits for some rows
    prob = {i: (i + 1) / 100 for i in range(20)}
    lqp = torch.tensor([math.log(prob[int(i)]) for i in pos]) if log_q else None
    lqn = torch.tensor([math.log(prob[int(i)]) for i in neg]) if log_q else None
    got = sampled_softmax_loss(q, vp, pos, vn, neg, temperature=tau, log_q_pos=lqp, log_q_neg=lqn)
    total = 0.0
    for b in range(B):
        row = [_dot(q[b], vp[b]) / tau - (math.log(prob[int(pos[b])]) if log_q else 0.0)]
        for j in range(K):
            if neg[j] == pos[b]:
                row.append(-math.inf)
            else:
                row.append(_dot(q[b], vn[j]) / tau - (math.log(prob[int(neg[j])]) if log_q else 0.0))
        total += _ce(row, 0)
    assert float(got) == pytest.approx(total / B, rel=1e-5)


def test_sampled_softmax_keeps_hits_when_asked():
    q, v = torch.ones(1, 2), torch.ones(1, 2)
    a = sampled_softmax_loss(q, v, torch.tensor([3]), torch.ones(1, 2), torch.tensor([3]))
    b = sampled_softmax_loss(q, v, torch.tensor([3]), torch.ones(1, 2), torch.tensor([3]),
                             remove_accidental_hits=False)
    assert float(a) == pytest.approx(0.0, abs=1e-7) and float(b) == pytest.approx(math.log(2), rel=1e-6)


def test_full_softmax_matches_direct():
    g = torch.Generator().manual_seed(2)
    q, v = torch.randn(4, 3, generator=g), torch.randn(9, 3, generator=g)
    t = torch.tensor([0, 8, 3, 3])
    got = full_softmax_loss(q, v, t, temperature=0.7)
    want = sum(_ce([_dot(q[b], v[j]) / 0.7 for j in range(9)], int(t[b])) for b in range(4)) / 4
    assert float(got) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("block, tau, weighted", [(1 << 19, 1.0, False), (9 * 3, 0.7, True), (9 * 4, 1.0, True)])
def test_full_softmax_gradients_match_autograd_of_the_direct_formula(monkeypatch, block, tau, weighted):
    """The blockwise loss and the gradients it computes in its forward equal autograd through the written-out
    softmax (log-sum-exp of every logit), with blocks of 3 / 4 rows that do not divide the 10 rows."""
    from ctrkit.retrieval import losses

    monkeypatch.setattr(losses, "FULL_SOFTMAX_BLOCK", block)
    g = torch.Generator().manual_seed(3)
    q0, v0 = torch.randn(10, 5, generator=g, dtype=torch.float64), torch.randn(9, 5, generator=g, dtype=torch.float64)
    t = torch.tensor([0, 8, 3, 3, 1, 2, 2, 7, 5, 0])
    w = torch.rand(10, generator=g, dtype=torch.float64) if weighted else torch.ones(10, dtype=torch.float64)
    q, v = q0.clone().requires_grad_(), v0.clone().requires_grad_()
    (3.0 * full_softmax_loss(q, v, t, temperature=tau, weights=w if weighted else None)).backward()
    qr, vr = q0.clone().requires_grad_(), v0.clone().requires_grad_()
    s = qr @ vr.t() / tau
    ce = torch.stack([torch.log(torch.exp(s[b]).sum()) - s[b, t[b]] for b in range(10)])
    want = (ce * w).sum() / w.sum()
    (3.0 * want).backward()
    got = full_softmax_loss(q0, v0, t, temperature=tau, weights=w if weighted else None)
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    torch.testing.assert_close(q.grad, qr.grad)
    torch.testing.assert_close(v.grad, vr.grad)


def test_full_softmax_gradient_of_the_queries_only():
    """A catalogue that needs no gradient (e.g. frozen item vectors): the queries' gradient alone, the same."""
    g = torch.Generator().manual_seed(4)
    q0, v = torch.randn(6, 4, generator=g), torch.randn(11, 4, generator=g)
    t = torch.tensor([1, 10, 4, 4, 0, 2])
    q = q0.clone().requires_grad_()
    full_softmax_loss(q, v, t).backward()
    qr = q0.clone().requires_grad_()
    torch.nn.functional.cross_entropy(qr @ v.t(), t).backward()
    torch.testing.assert_close(q.grad, qr.grad)


def test_cross_batch_softmax_is_in_batch_softmax_on_one_batch_and_a_loop_on_a_larger_one():
    """With the batch as its own candidates it is the in-batch softmax; with candidates from a larger (padded)
    batch it is the per-row cross entropy over the valid, non-duplicate candidates, as a loop computes it."""
    from ctrkit.retrieval.losses import cross_batch_softmax_loss, in_batch_softmax_loss

    g = torch.Generator().manual_seed(0)
    q, v = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    ids = torch.tensor([3, 5, 3, 7, 8, 9])
    lq = torch.rand(6, generator=g).log()
    torch.testing.assert_close(cross_batch_softmax_loss(q, ids, torch.arange(6), v, ids, temperature=0.5, log_q=lq),
                               in_batch_softmax_loss(q, v, ids, temperature=0.5, log_q=lq))
    cols = torch.randn(10, 4, generator=g)
    col_ids = torch.tensor([3, 5, -1, 3, 7, 4, 8, 9, 2, -1])  # rank 1's rows start at column 5; -1: padding
    mine, targets = torch.tensor([4, 8, 9, 2]), torch.tensor([5, 6, 7, 8])
    w = torch.tensor([1.0, 2.0, 0.5, 1.0])
    want = []
    for b in range(4):
        logits = [float(q[b] @ cols[c]) / 0.5 for c in range(10)]
        ok = [c == targets[b] or (col_ids[c] >= 0 and col_ids[c] != mine[b]) for c in range(10)]
        denom = math.log(sum(math.exp(x) for x, k in zip(logits, ok) if k))
        want.append(denom - logits[int(targets[b])])
    ref = sum(x * float(wi) for x, wi in zip(want, w)) / float(w.sum())
    got = cross_batch_softmax_loss(q[:4], mine, targets, cols, col_ids, temperature=0.5, weights=w)
    assert float(got) == pytest.approx(ref, rel=1e-5)


def test_full_softmax_under_no_grad_gives_the_same_loss(monkeypatch):
    """Scored under torch.no_grad (inputs that require grad, e.g. a validation loss): the same value, no graph."""
    from ctrkit.retrieval import losses

    monkeypatch.setattr(losses, "FULL_SOFTMAX_BLOCK", 9 * 3)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(10, 5, generator=g, dtype=torch.float64).requires_grad_()
    v = torch.randn(9, 5, generator=g, dtype=torch.float64).requires_grad_()
    t = torch.tensor([0, 8, 3, 3, 1, 2, 2, 7, 5, 0])
    want = full_softmax_loss(q, v, t, temperature=0.7)
    with torch.no_grad():
        got = full_softmax_loss(q, v, t, temperature=0.7)
    assert not got.requires_grad
    assert float(got) == pytest.approx(float(want), rel=1e-12)
