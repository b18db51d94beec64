"""The implicit-change template: parse, validate, rebuild, segments and Table 14 statistics."""

from __future__ import annotations

import random

import pytest

from namc.data.synthetic import corpus_record, make_pair
from namc.text.template import (
    VERBS,
    RejectReason,
    TemplateError,
    TemplateStats,
    parse,
    rebuild,
    segments,
    validate,
)

# The paper's own generated descriptions (Figures 7a, 7b, 8 and 10), copied from the paper text.
FIG7A = (
    "The difference between two images is that the first image shows a bee on a wooden surface, while the second "
    "image shows a bee against a plain white background."
)
FIG7B = (
    "The difference between two images is that the first image features a golfer holding a golf club in a position "
    "that suggests he is in the middle of a swing, while the second image shows a golfer holding a golf club with "
    "the head of the club positioned just behind the ball, indicating the moment of impact or just before it."
)
FIG8 = (
    "The difference between two images is that the first image shows a person jumping, with each frame capturing "
    "the person in mid-air, while the second image depicts a bald eagle standing on the edge of a body of water, "
    "looking downwards."
)
FIG10 = (
    'The difference between two images is that the first image shows a typewriter with the word "HUNGER" typed on '
    "the paper, while the second image shows a typewriter with the keys visible and no text on the paper."
)

PAPER_EXAMPLES = [
    (FIG7A, ("shows", "a bee on a wooden surface", "shows", "a bee against a plain white background")),
    (
        FIG7B,
        (
            "features",
            "a golfer holding a golf club in a position that suggests he is in the middle of a swing",
            "shows",
            "a golfer holding a golf club with the head of the club positioned just behind the ball, indicating the "
            "moment of impact or just before it",
        ),
    ),
    (
        FIG8,
        (
            "shows",
            "a person jumping, with each frame capturing the person in mid-air",
            "depicts",
            "a bald eagle standing on the edge of a body of water, looking downwards",
        ),
    ),
    (
        FIG10,
        (
            "shows",
            'a typewriter with the word "HUNGER" typed on the paper',
            "shows",
            "a typewriter with the keys visible and no text on the paper",
        ),
    ),
]


@pytest.mark.parametrize(("text", "expected"), PAPER_EXAMPLES)
def test_paper_examples_parse_and_round_trip(text: str, expected: tuple[str, str, str, str]) -> None:
    parsed = parse(text)
    assert tuple(parsed) == expected
    canonical = rebuild(*parsed)
    # the canonical text only differs from the paper's by the template's "the two images"
    assert canonical == text.replace("between two images", "between the two images")
    assert parse(canonical) == parsed
    assert validate(text) is None


def test_generated_descriptions_round_trip() -> None:
    for i in range(200):
        record, _ = corpus_record(make_pair(3, i, "corpus"), seed=3, noise_rate=0.3)
        parsed = parse(record["description"])
        assert parsed == (record["verb1"], record["desc1"], record["verb2"], record["desc2"])
        assert rebuild(*parsed) == record["description"]


def test_tolerated_variations() -> None:
    base = ("shows", "a red cube, left of a ball", "shows", "a blue cube")
    variants = [
        "The difference between the two images is that the first image shows a red cube, left of a ball, while the "
        "second image shows a blue cube.",
        "the difference between two images is that the first image shows a red cube, left of a ball, while the second "
        "image shows a blue cube",  # lower case, no "the", no final period
        "THE DIFFERENCE BETWEEN THE TWO IMAGES IS THAT THE FIRST IMAGE SHOWS a red cube, left of a ball, WHILE THE "
        "SECOND IMAGE SHOWS a blue cube.",
        "  The difference between the two images is that the first image  shows\na red cube, left of a ball while the "
        "second image shows a blue cube. ",  # odd whitespace, missing comma before "while"
    ]
    for v in variants:
        assert parse(v) == base, v


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", RejectReason.EMPTY),
        ("   ", RejectReason.EMPTY),
        (None, RejectReason.EMPTY),
        ("A cat sits on a mat.", RejectReason.OFF_TEMPLATE),
        (
            "The difference between the two images is that the first image shows a cat, whereas the second image "
            "shows a dog.",
            RejectReason.OFF_TEMPLATE,
        ),
        ("The difference between the two images is that the first image shows a cat.", RejectReason.OFF_TEMPLATE),
        (
            "The difference between the two images is that the first image portrays a cat, while the second image "
            "shows a dog.",
            RejectReason.UNKNOWN_VERB,
        ),
        (
            "The difference between the two images is that the first image shows a cat, while the second image does "
            "not show a dog.",
            RejectReason.UNKNOWN_VERB,
        ),
        (
            "The difference between the two images is that the first image shows, while the second image shows a dog.",
            RejectReason.EMPTY_HALF,
        ),
        (
            "The difference between the two images is that the first image shows a cat, while the second image.",
            RejectReason.EMPTY_HALF,
        ),
        (
            "The difference between the two images is that the first image shows a cat, while the second image does "
            "not.",
            RejectReason.NEGATION_ONLY,
        ),
        (
            "The difference between the two images is that the first image is, while the second image is not.",
            RejectReason.NEGATION_ONLY,
        ),
        (
            "The difference between the two images is that the first image was not, while the second image shows a "
            "dog.",
            RejectReason.NEGATION_ONLY,
        ),
        (
            "The difference between the two images is that the first image shows a cat, while the second image "
            "shows nothing.",
            RejectReason.NEGATION_ONLY,
        ),
        (
            "The difference between the two images is that the first image shows a cat, while the second image "
            "doesn't.",
            RejectReason.NEGATION_ONLY,
        ),
    ],
)
def test_rejection_reasons(text: str, reason: RejectReason) -> None:
    assert validate(text) is reason
    with pytest.raises(TemplateError) as info:
        parse(text)
    assert info.value.reason is reason
    assert isinstance(info.value, ValueError)


def test_is_as_verb_is_not_negation() -> None:
    parsed = parse(
        "The difference between the two images is that the first image is a sunny beach, while the second image is "
        "not a beach but a snowy field."
    )
    assert parsed.verb1 == "is" and parsed.desc2 == "not a beach but a snowy field"


def test_segments_spacing_contract() -> None:
    prefix, middle, suffix = segments("Shows", "depicts")
    assert prefix == "The difference between the two images is that the first image shows"
    assert middle == ", while the second image depicts"
    assert suffix == "."
    for d1, d2 in [("a [MASK] cube", "a blue cube"), ("x", "y, z")]:
        assert rebuild("shows", d1, "depicts", d2) == prefix + " " + d1 + middle + " " + d2 + suffix
    with pytest.raises(ValueError):
        segments("portrays", "shows")


def test_rebuild_normalises_and_validates() -> None:
    assert rebuild("SHOWS", "  a  red\ncube ", "has", "a blue cube") == (
        "The difference between the two images is that the first image shows a red cube, while the second image has "
        "a blue cube."
    )
    with pytest.raises(ValueError):
        rebuild("shows", "  ", "shows", "x")
    with pytest.raises(ValueError):
        rebuild("", "x", "shows", "y")  # the paper's empty verb slot is not a verb


def test_verb_list_matches_appendix_d2() -> None:
    # appendix D.2 prints 50 slots, one empty: 49 verbs remain, in order, without duplicates
    assert len(VERBS) == 49 and len(set(VERBS)) == 49
    assert VERBS[:5] == ("is", "describes", "depicts", "illustrates", "displays")
    assert VERBS[-1] == "centers" and "" not in VERBS
    frame = "The difference between the two images is that the first image {} a cat, while the second image {} a dog."
    for verb in VERBS:
        text = frame.format(verb, verb)
        assert parse(text).verb1 == verb


def test_statistics_match_hand_counts() -> None:
    good = "The difference between the two images is that the first image shows {}, while the second image shows {}."
    a, b, c = good.format("a", "b"), good.format("c", "d"), good.format("e", "f")
    off = "No template here."
    neg = "The difference between the two images is that the first image shows a cat, while the second image is not."
    stats = TemplateStats()
    stats.update(
        [("ip", a), ("ip", a), ("ip", "  " + a + "\n"), ("ip", b), ("ip", off), ("cc", a), ("cc", c), ("cc", neg)]
    )
    rows = stats.rows()
    ip, cc, overall = rows["ip"], rows["cc"], rows["overall"]
    assert (ip.total, ip.unique, ip.repetition) == (4, 2, 2)  # the whitespace variant of a is a repeat
    assert ip.repetition_ratio == pytest.approx(0.5)
    assert ip.rejected == {"off_template": 1}
    assert (cc.total, cc.unique, cc.repetition) == (2, 2, 0)
    assert cc.rejected == {"negation_only": 1}
    # Table 14's overall row sums the per-source rows (a repeated across sources is unique in each)
    assert (overall.total, overall.unique, overall.repetition) == (6, 4, 2)
    assert overall.rejected == {"off_template": 1, "negation_only": 1}
    assert overall.rejection_ratio == pytest.approx(2 / 8)
    assert list(rows) == ["ip", "cc", "overall"]


def test_table_truncates_ratios_like_table_14() -> None:
    good = "The difference between the two images is that the first image shows a, while the second image shows b."
    stats = TemplateStats()
    stats.update([("sp", good)] * 3)  # repetition 2 / 3 = 66.666...%: Table 14 style truncates to 66.66%
    table = stats.format_table()
    assert "66.66%" in table and "66.67%" not in table
    assert table.splitlines()[1].split()[:4] == ["sp", "3", "1", "2"]


def test_parse_is_insensitive_to_random_whitespace() -> None:
    rng = random.Random(0)
    _, expected = PAPER_EXAMPLES[2]
    for _ in range(20):
        words = FIG8.split(" ")
        text = "".join(w + rng.choice([" ", "  ", "\n", "\t "]) for w in words)
        assert tuple(parse(text)) == expected
