"""Exact-match scoring: normalisation and best_subspan_em."""

from pc_cpu.benchmarks.scoring import best_subspan_em, normalize_answer


def test_normalize_drops_case_punctuation_articles_and_extra_space():
    assert normalize_answer("  The  Eiffel-Tower, in Paris! ") == "eiffeltower in paris"
    assert normalize_answer("An apple a day") == "apple day"


def test_article_inside_a_word_is_kept():
    assert normalize_answer("Theatre anthem") == "theatre anthem"


def test_gold_answer_as_substring_of_the_output_counts():
    assert best_subspan_em("It was Wilhelm Conrad Röntgen, in 1901.", ["Wilhelm Conrad Röntgen"])
    assert best_subspan_em("the answer is PARIS", ["Lyon", "paris"])


def test_missing_or_empty_gold_answers_do_not_count():
    assert not best_subspan_em("It was Einstein.", ["Röntgen"])
    assert not best_subspan_em("anything", ["", "the"])  # normalise to empty: never a match


def test_accents_are_compared_after_unicode_decomposition():
    assert best_subspan_em("Roentgen or Röntgen", ["Röntgen"])
