"""The paper's math (namc.ops) against hand-computed values."""

import math

import pytest
import torch

from namc import ops


def test_similarity_and_relevance_hand_computed():
    # two patches, three tokens (the last is padding)
    h_img = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # (1, 2, 2)
    h_txt = torch.tensor([[[3.0, 0.0], [1.0, 1.0], [0.0, 5.0]]])  # (1, 3, 2)
    valid = torch.tensor([[True, True, False]])
    s = ops.similarity_matrix(h_img, h_txt)
    r2 = 1 / math.sqrt(2)
    expected = torch.tensor([[[1.0, r2, 0.0], [0.0, r2, 1.0]]])
    torch.testing.assert_close(s, expected)
    r_img, r_txt = ops.token_relevance(h_img, h_txt, valid)
    # row max over valid tokens only: patch 2's best valid match is token 2 (0.707), not the padding (1.0)
    torch.testing.assert_close(r_img, torch.tensor([[1.0, r2]]))
    # column max over patches; the padding column is zeroed
    torch.testing.assert_close(r_txt, torch.tensor([[1.0, r2, 0.0]]))


def test_relevance_without_valid_words_is_zero():
    r_img, r_txt = ops.token_relevance(torch.randn(2, 4, 8), torch.randn(2, 3, 8), torch.zeros(2, 3, dtype=torch.bool))
    assert torch.equal(r_img, torch.zeros(2, 4))
    assert torch.equal(r_txt, torch.zeros(2, 3))


def test_mask_probabilities_hand_computed():
    ir = torch.tensor([[0.1, 0.3, 0.5, 0.9]])
    valid = torch.tensor([[True, True, True, False]])
    p = ops.mask_probabilities(ir, 0.2, valid)
    # mean over valid entries = 0.3 -> 0.2 + (0.1, 0.3, 0.5) - 0.3 ; invalid -> 0
    torch.testing.assert_close(p, torch.tensor([[0.0, 0.2, 0.4, 0.0]]))
    # clamped into [0, 1]
    p = ops.mask_probabilities(torch.tensor([[0.0, 2.0]]), 0.5)
    torch.testing.assert_close(p, torch.tensor([[0.0, 1.0]]))


def test_random_mask_probabilities():
    valid = torch.tensor([[True, False, True]])
    torch.testing.assert_close(ops.random_mask_probabilities(valid, 0.15), torch.tensor([[0.15, 0.0, 0.15]]))


def test_sample_mask_reproducible_and_tracks_p():
    probs = ops.mask_probabilities(torch.full((64, 196), 0.4), 0.2)  # uniform relevance -> P = p everywhere
    torch.testing.assert_close(probs, torch.full((64, 196), 0.2))
    a = ops.sample_mask(probs, torch.Generator().manual_seed(7))
    b = ops.sample_mask(probs, torch.Generator().manual_seed(7))
    c = ops.sample_mask(probs, torch.Generator().manual_seed(8))
    assert a.dtype == torch.bool and torch.equal(a, b) and not torch.equal(a, c)
    assert abs(a.float().mean().item() - 0.2) < 0.01  # 12,544 draws: std of the mean ~0.0036


def test_special_tokens_never_masked():
    words = torch.zeros(32, 12, dtype=torch.bool)
    words[:, 1:7] = True  # [SOS] at 0, [EOS] at 7, padding after
    ir = torch.rand(32, 12) * 2  # even very irrelevant specials/padding
    mask = ops.sample_mask(ops.mask_probabilities(ir, 0.9, words), torch.Generator().manual_seed(0))
    assert not mask[~words].any()
    assert mask[words].any()


def test_noise_masking_prefers_irrelevant_positions():
    ir = torch.tensor([[0.0] * 50 + [0.6] * 50]).repeat(200, 1)
    mask = ops.sample_mask(ops.mask_probabilities(ir, 0.3), torch.Generator().manual_seed(1))
    assert mask[:, 50:].float().mean() > 0.55 and mask[:, :50].float().mean() < 0.05


def test_sdm_loss_hand_computed_two_by_two():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    txt = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    pos = torch.eye(2, dtype=torch.bool)
    tau = 0.5
    s = torch.tensor([[1.0, 1 / math.sqrt(2)], [0.0, 1 / math.sqrt(2)]]) / tau
    eps = 1e-8

    def kl_rows(logits, q):
        p = logits.softmax(1)
        return (p * (logits.log_softmax(1) - torch.log(q + eps))).sum(1).mean()

    q = torch.eye(2)
    expected = kl_rows(s, q) + kl_rows(s.T, q)
    torch.testing.assert_close(ops.sdm_loss(img, txt, pos, tau=tau), expected)


def test_sdm_loss_aligned_vs_shuffled_and_duplicates():
    torch.manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(8, 16), dim=-1)
    pos = torch.eye(8, dtype=torch.bool)
    aligned = ops.sdm_loss(emb, emb, pos)
    shuffled = ops.sdm_loss(emb, emb[torch.randperm(8)], pos)
    assert aligned < 1e-3
    assert shuffled > 10 * aligned + 1.0
    # texts 0 and 1 identical: both images match both texts; counting them as positives gives a lower loss
    txt = emb.clone()
    txt[1] = txt[0]
    img = emb.clone()
    img[1] = img[0]
    dup = pos.clone()
    dup[0, 1] = dup[1, 0] = True
    assert ops.sdm_loss(img, txt, dup) < ops.sdm_loss(img, txt, pos)
    assert ops.sdm_loss(img, txt, dup) < 1e-3


def test_sdm_gradients_reach_both_inputs():
    img = torch.randn(4, 8, requires_grad=True)
    txt = torch.randn(4, 8, requires_grad=True)
    ops.sdm_loss(img, txt, torch.eye(4, dtype=torch.bool)).backward()
    assert img.grad.abs().sum() > 0 and txt.grad.abs().sum() > 0


def test_info_nce_matches_cross_entropy():
    img, txt = torch.randn(5, 6), torch.randn(5, 6)
    logits = torch.nn.functional.normalize(img, dim=-1) @ torch.nn.functional.normalize(txt, dim=-1).T / 0.1
    t = torch.arange(5)
    expected = (torch.nn.functional.cross_entropy(logits, t) + torch.nn.functional.cross_entropy(logits.T, t)) / 2
    torch.testing.assert_close(ops.info_nce_loss(img, txt, tau=0.1), expected)


def test_masked_token_ce_and_empty():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    targets = torch.tensor([0, 1])
    expected = -(torch.log_softmax(logits, 1)[0, 0] + torch.log_softmax(logits, 1)[1, 1]) / 2
    torch.testing.assert_close(ops.masked_token_ce(logits, targets), expected)
    empty = torch.zeros(0, 2, requires_grad=True)
    out = ops.masked_token_ce(empty, torch.zeros(0, dtype=torch.long))
    assert out.item() == 0.0 and out.requires_grad


@pytest.mark.parametrize("kind", ["l1", "l2"])
def test_masked_regression_only_masked_positions(kind):
    pred = torch.zeros(1, 3, 2)
    target = torch.tensor([[[1.0, 1.0], [100.0, 100.0], [3.0, -3.0]]])
    mask = torch.tensor([[True, False, True]])
    got = ops.masked_regression_loss(pred, target, mask, kind)
    expected = 2.0 if kind == "l1" else (1 + 1 + 9 + 9) / 4
    assert got.item() == pytest.approx(expected)
    with pytest.raises(ValueError):
        ops.masked_regression_loss(pred, target, mask, "l3")


def test_caption_ce_ignores_positions():
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, 2, -100], [-100, -100, 4]])
    flat = logits.reshape(-1, 5)
    keep = targets.reshape(-1) != -100
    expected = torch.nn.functional.cross_entropy(flat[keep], targets.reshape(-1)[keep])
    torch.testing.assert_close(ops.caption_ce(logits, targets), expected)
    assert ops.caption_ce(logits, torch.full((2, 3), -100)).item() == 0.0


def test_token_sigmoid_loss_by_hand_and_ignores_invalid_words():
    torch.manual_seed(0)
    h_img, h_txt = torch.randn(2, 3, 4), torch.randn(2, 2, 4)
    valid = torch.tensor([[True, True], [True, False]])
    scale, bias = 5.0, -2.0
    got = ops.token_sigmoid_loss(h_img, h_txt, valid, torch.tensor(scale), torch.tensor(bias))
    cos = lambda a, b: float(torch.nn.functional.cosine_similarity(a, b, dim=0))  # noqa: E731
    bce = lambda s, y: math.log1p(math.exp(-(scale * s + bias) if y else scale * s + bias))  # noqa: E731
    words, patches = [], []
    for i in range(2):
        for j in range(2):
            for w in range(2):
                if valid[j, w]:
                    words.append(bce(max(cos(h_img[i, n], h_txt[j, w]) for n in range(3)), i == j))
            for n in range(3):
                best = max(cos(h_img[i, n], h_txt[j, w]) for w in range(2) if valid[j, w])
                patches.append(bce(best, i == j))
    want = (sum(words) / len(words) + sum(patches) / len(patches)) / 2
    assert float(got) == pytest.approx(want, rel=1e-5)
    changed = h_txt.clone()
    changed[1, 1] = torch.randn(4)  # an invalid position changes nothing
    again = ops.token_sigmoid_loss(h_img, changed, valid, torch.tensor(scale), torch.tensor(bias))
    assert float(again) == pytest.approx(float(got), rel=1e-6)


def test_token_sigmoid_loss_prefers_grounded_words():
    # words that match a patch of their own image only score lower loss than words matching every image alike
    eye = torch.eye(4)
    h_img = eye[:, None, :].expand(4, 2, 4).clone()  # image i: two patches equal to e_i
    grounded = eye[:, None, :].clone()  # text i: one word e_i
    generic = torch.ones(4, 1, 4)  # text i: one word equally close to every image
    valid = torch.ones(4, 1, dtype=torch.bool)
    scale, bias = torch.tensor(10.0), torch.tensor(-5.0)
    assert ops.token_sigmoid_loss(h_img, grounded, valid, scale, bias) < ops.token_sigmoid_loss(
        h_img, generic, valid, scale, bias
    )


def test_ngram_presence_by_hand():
    # 1 = [SOS], 2 = [EOS], 0 = padding; words: 5 "a", 6 "red", 7 "near", 8 "cube"
    ids = torch.tensor([[1, 5, 6, 8, 2, 0], [1, 7, 5, 6, 8, 2], [1, 5, 8, 2, 0, 0]])
    valid = ids > 2
    uni = ops.ngram_presence(ids, valid, 1)
    bi = ops.ngram_presence(ids, valid, 2)
    assert uni.shape == bi.shape == (3, 3, 6)
    for n, got in ((1, uni), (2, bi)):
        for i in range(3):
            grams_i = {tuple(ids[i, m - n + 1 : m + 1].tolist()) for m in range(6) if valid[i, m]}
            for j in range(3):
                for pos in range(6):
                    want = bool(valid[j, pos]) and tuple(ids[j, pos - n + 1 : pos + 1].tolist()) in grams_i
                    assert bool(got[i, j, pos]) == want, (n, i, j, pos)
    assert bool(uni[0, 1, 2]) and not bool(bi[0, 1, 2])  # "a" occurs in 0, "near a" does not
    assert bool(bi[0, 1, 3]) and bool(bi[2, 0, 1])  # "a red" in both; "[SOS] a" in both
    assert bool(bi.diagonal(dim1=0, dim2=1).T[valid].all())  # the own description always has its n-grams
    with pytest.raises(ValueError):
        ops.ngram_presence(ids, valid, 0)


def test_token_sigmoid_loss_ngram_labels_by_hand():
    torch.manual_seed(1)
    ids = torch.tensor([[1, 5, 6, 2], [1, 7, 5, 2]])
    valid = ids > 2
    h_img, h_txt = torch.randn(2, 3, 4), torch.randn(2, 4, 4)
    scale, bias = 4.0, -1.0
    got = ops.token_sigmoid_loss(h_img, h_txt, valid, torch.tensor(scale), torch.tensor(bias), ids=ids, ngram=1)
    cos = lambda a, b: float(torch.nn.functional.cosine_similarity(a, b, dim=0))  # noqa: E731
    bce = lambda s, y: math.log1p(math.exp(-(scale * s + bias) if y else scale * s + bias))  # noqa: E731
    words, patches = [], []
    for i in range(2):
        for j in range(2):
            real = [w for w in range(4) if valid[j, w]]
            for w in real:  # label: the word occurs in description i
                words.append(
                    bce(max(cos(h_img[i, n], h_txt[j, w]) for n in range(3)), int(ids[j, w]) in ids[i, 1:3].tolist())
                )
            for n in range(3):
                patches.append(bce(max(cos(h_img[i, n], h_txt[j, w]) for w in real), i == j))
    want = (sum(words) / len(words) + sum(patches) / len(patches)) / 2
    assert float(got) == pytest.approx(want, rel=1e-5)
    pair_labels = ops.token_sigmoid_loss(h_img, h_txt, valid, torch.tensor(scale), torch.tensor(bias))
    assert float(pair_labels) != pytest.approx(float(got), rel=1e-3)  # "a" (5) is shared: the labels differ
    with pytest.raises(ValueError, match="ids"):
        ops.token_sigmoid_loss(h_img, h_txt, valid, torch.tensor(scale), torch.tensor(bias), ngram=2)
