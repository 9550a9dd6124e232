"""Names are data, never markup (SPEC §8, issue #30 item 5): one escaping helper per output medium.

Everything a gateway names -- channel, route, reasons, messages, an
operator's ``--reason`` -- reaches terminals, logs, HTML, plots, IM
messages and SQL. Each helper below makes such text inert in one medium and
says which rule of that medium it follows. All of them first apply
:func:`terminal_text` (control characters made visible), so no medium gets
an ESC byte, a line break or a bidi override from a name.

==================  ============================  ================================
medium              helper                        neutralises
==================  ============================  ================================
terminal, logs      :func:`terminal_text`         C0/C1/DEL (ESC, so CSI and OSC
                                                  sequences), bidi controls,
                                                  line/paragraph separators
log records         :func:`install_log_escaping`  the same, on every log record
rich (tables)       :func:`rich_text`             ``[...]`` markup (a ``Text``
                                                  is never parsed)
matplotlib          :func:`plot_text`             mathtext ``$...$``, legend's
                                                  ``_`` prefix
HTML                :func:`html_text`             ``& < > " '``
Slack mrkdwn        :func:`slack_text`            ``& < >`` (``<!channel>``,
                                                  ``<url|text>``)
DingTalk / WeCom    :func:`im_markdown`           markdown ``\\`*_[]()#~|!``,
markdown                                          tags ``<@id>`` ``<font>``
Feishu text         :func:`feishu_text`           ``<at user_id=...>`` tags
SQL literal         :func:`sql_literal`           quote, backslash; code-span and
(ClickHouse)                                      IM metacharacters as ``\\xHH``
==================  ============================  ================================

Printable ASCII passes :func:`terminal_text`, :func:`rich_text` and
:func:`feishu_text` unchanged; the other helpers change only their
medium's metacharacters.
"""

from __future__ import annotations

import logging
import re
import threading
from html import escape as _html_escape
from typing import Any, Callable

#: Characters a terminal or a log viewer acts on: C0 controls (incl. ESC, which starts CSI ``ESC [`` and OSC
#: ``ESC ]`` sequences, and BEL/ST ending them), DEL, C1 controls (incl. the 8-bit CSI U+009B and OSC
#: U+009D, ECMA-48 §5.3), the Unicode bidi controls that reorder what is shown (U+061C, U+200E/F,
#: U+202A-U+202E, U+2066-U+2069; Unicode TR #9 and the "Trojan Source" advisory CVE-2021-42574), and
#: the line/paragraph separators U+2028/U+2029 (a line break to some viewers).
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(m: re.Match[str]) -> str:
    ch = m.group(0)
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: Any) -> str:
    """``str(text)`` with every character in :data:`UNSAFE` written as a visible escape.

    ``\\n``, ``\\r`` and ``\\t`` for newline, CR and tab, ``\\xNN`` for the other
    C0/C1 controls and DEL (ESC is ``\\x1b``: a CSI/OSC sequence loses its
    introducer and prints as plain text), ``\\uNNNN`` for the bidi controls and
    U+2028/U+2029. The result is one line with no control character; printable
    ASCII and other text (e.g. CJK names) are unchanged. Never raises.

    >>> terminal_text("a\\nFAKE \\x1b[2J\\u202e")
    'a\\\\nFAKE \\\\x1b[2J\\\\u202e'
    """
    s = text if isinstance(text, str) else str(text)
    return UNSAFE.sub(_visible, s) if UNSAFE.search(s) else s


def rich_text(text: Any, style: str = "") -> Any:
    """A :class:`rich.text.Text` of :func:`terminal_text` of ``text``: rich never parses it as markup.

    Rich reads ``[...]`` in a plain ``str`` as console markup (rich docs, "Console Markup"): ``x/[/bold]``
    raises ``MarkupError`` and ``[red]`` restyles. A ``Text`` is printed as is. ``style``: a rich style
    applied to the whole text (ours, never the name's).
    """
    from rich.text import Text

    return Text(terminal_text(text), style=style)


def rich_markup(text: Any) -> str:
    """:func:`terminal_text` of ``text`` with rich markup escaped (:func:`rich.markup.escape`), for
    embedding a name in a markup string that also holds our own tags. Prefer :func:`rich_text`."""
    from rich.markup import escape

    return escape(terminal_text(text))


def plot_text(text: Any) -> str:
    """Text for a matplotlib label, title, tick or legend entry, shown exactly as the name reads.

    Matplotlib parses a string with an even number of unescaped ``$`` as mathtext (matplotlib docs,
    "Writing mathematical expressions": ``\\$`` is a literal dollar); ``x/$\\undefinedcommand$`` would
    raise at draw time. Every ``$`` becomes ``\\$``, which matplotlib shows as ``$`` (with and without
    ``text.parse_math``'s default; usetex is not used). A legend drops labels starting with ``_``
    (matplotlib ``Axes.legend``): such a name gets a leading space. Control characters: as
    :func:`terminal_text`.
    """
    s = terminal_text(text).replace("$", "\\$")
    return " " + s if s.startswith("_") else s


def html_text(text: Any) -> str:
    """:func:`terminal_text` of ``text``, then :func:`html.escape` with ``quote=True``: ``& < > " '``
    become character references (HTML Living Standard §13.1.4), so it is safe in element text and in
    quoted attribute values."""
    return _html_escape(terminal_text(text), quote=True)


def slack_text(text: Any) -> str:
    """Text for Slack ``mrkdwn`` and ``plain_text``: ``&`` → ``&amp;``, ``<`` → ``&lt;``, ``>`` → ``&gt;``.

    Slack's "Formatting text for app surfaces", section "Escaping text": these three are the control
    characters of its markup; escaping them turns ``<!channel>`` (mention everyone) and
    ``<https://evil|click>`` (a hidden link) into plain text. Nothing else is escaped (Slack decodes only
    these entities). Control characters: as :func:`terminal_text`.
    """
    return terminal_text(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


#: Markdown metacharacters escaped with a backslash (CommonMark 0.31 §2.4 "Backslash escapes": any ASCII
#: punctuation may be escaped): emphasis, links/images, code, headings, tables, strikethrough.
_MD_META = re.compile(r"([\\`*_\[\]()#~|!{}])")
#: ``<`` / ``>`` open HTML-like tags (WeCom ``<font>`` and ``<@userid>`` mentions, DingTalk ``<font>``,
#: Feishu ``<at user_id="all">``) and Markdown autolinks ``<url>``; none of these media documents an
#: escape for them, so they are replaced by the full-width forms U+FF1C / U+FF1E, which read the same.
_ANGLES = str.maketrans({"<": "\uff1c", ">": "\uff1e"})


def im_markdown(text: Any) -> str:
    """Text for DingTalk and WeCom ``markdown`` messages: no formatting, link, tag or mention survives.

    Markdown metacharacters ``\\ ` * _ [ ] ( ) # ~ | ! { }`` are backslash-escaped (CommonMark §2.4),
    ``<``/``>`` become ``＜``/``＞`` (see :data:`_ANGLES`). ``@all`` stays text: DingTalk mentions only the
    people listed in the message's ``at`` object (open.dingtalk.com "Custom robot"; we never send one)
    and WeCom markdown only ``<@userid>`` (developer.work.weixin.qq.com/document/path/91770).
    Control characters: as :func:`terminal_text` (a newline cannot start a heading or a quote).
    """
    return _MD_META.sub(r"\\\1", terminal_text(text)).translate(_ANGLES)


def feishu_text(text: Any) -> str:
    """Text for a Feishu/Lark custom bot ``text`` message: ``<``/``>`` as ``＜``/``＞``.

    A ``text`` message is plain text except its ``<at user_id="...">`` tags (open.feishu.cn, custom bot
    guide, "@ users in text messages"; ``user_id="all"`` pings everyone); without ``<`` no tag opens.
    Control characters: as :func:`terminal_text`.
    """
    return terminal_text(text).translate(_ANGLES)


#: Characters written as ``\\xHH`` in :func:`sql_literal`: what an IM message would act on even inside a
#: Markdown code span (a backtick ends it; Slack, WeCom and Feishu read ``< > &`` there; DingTalk has no
#: code spans at all, so links ``[...](...)`` and emphasis ``*`` are neutralised too).
_SQL_HEX = re.compile(r"[`<>&\[\]()*]")


def sql_literal(text: Any) -> str:
    """A ClickHouse string literal (with its quotes) of ``str(text)``, safe to print inside a code span.

    ClickHouse string literals take backslash escapes (ClickHouse docs, "Syntax: String"): ``\\`` and
    ``'`` are written ``\\\\`` and ``\\'``; backtick, ``< > & [ ] ( ) *`` and every :data:`UNSAFE`
    character as the ``\\xHH`` escapes of their UTF-8 bytes. The literal selects exactly ``text`` and
    holds no character that Slack, WeCom, Feishu or a terminal would act on, even inside a code span.
    Other characters (letters, digits, CJK, ``@ / . - _``) stay readable.

    >>> print(sql_literal("a'b`<x>\\n"))
    'a\\'b\\x60\\x3cx\\x3e\\x0a'
    """
    def hexed(m: re.Match[str]) -> str:
        return "".join(f"\\x{b:02x}" for b in m.group(0).encode("utf-8"))

    s = (text if isinstance(text, str) else str(text)).replace("\\", "\\\\").replace("'", "\\'")
    return "'" + UNSAFE.sub(hexed, _SQL_HEX.sub(hexed, s)) + "'"


class EscapingRecordFactory:
    """A log-record factory (:func:`logging.setLogRecordFactory`) wrapping ``base``: a record whose rendered
    message holds an :data:`UNSAFE` character gets :func:`terminal_text` of it as its message (args cleared).

    A newline in a channel name is then written ``\\n`` and cannot forge a second log line; an ESC cannot
    reach the terminal. Tracebacks are not part of the message (formatters add them) and keep their lines.
    """

    def __init__(self, base: Callable[..., logging.LogRecord]):
        self.base = base

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return record
        if UNSAFE.search(message):
            record.msg, record.args = terminal_text(message), None
        return record


_log_lock = threading.Lock()


def install_log_escaping() -> None:
    """Make every later log record of this process one line without control characters.

    Wraps the current log-record factory in :class:`EscapingRecordFactory` (a factory covers every logger
    and handler, faust's and aiokafka's included); does nothing when it already is one. Call it where a
    process configures logging: the worker, the alert process, the sink child.
    """
    with _log_lock:
        current = logging.getLogRecordFactory()
        if not isinstance(current, EscapingRecordFactory):
            logging.setLogRecordFactory(EscapingRecordFactory(current))
