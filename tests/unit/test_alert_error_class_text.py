"""pipeline.alert.error_class_text: the class line an alert may carry (issue #32 part 3)."""

from __future__ import annotations

from pipeline.alert.error_class_text import error_class_line


def test_dead_key_line_names_the_account_and_its_channels():
    m = {"error_class": "credential", "account": "acct-a", "account_channels": 2, "error_message": "bad key"}
    assert error_class_line(["credential_invalid"], m) == "dead key on account acct-a (2 channels) — bad key"
    assert error_class_line(["quota_exhausted"], {"error_class": "quota_exhausted"}) == "quota exhausted"
    assert error_class_line(["credential_invalid"], {"error_class": "credential", "account": "a",
                                                     "account_channels": 1}) == "dead key on account a (1 channel)"


def test_rate_limit_and_caller_lines_and_none():
    assert error_class_line(["rate_limited"], {"error_class": "rate_limited", "retry_after_s": 20.0}) == \
        "rate limited, Retry-After 20 s"
    assert error_class_line(["caller_errors"], {"caller_errors_5m": 12}) == \
        "12 caller errors in 5 min (the client's requests, not the channel)"
    assert error_class_line(["error_rate"], {"error_rate_1m": 0.2}) is None
    assert error_class_line([], {"error_class": "transient"}) is None
