"""Text from a model or a server, made safe to print: control characters shown, never obeyed.

A server decides what its model says, and a model can say `ESC[2J` (clear the screen),
`ESC]0;...` (retitle the window) or `ESC]52;c;...` (write the user's clipboard). Written to
a terminal as they are, those are commands. `visible()` turns every C0 and C1 control
character but tab and newline, and DEL, into a printable stand-in of one character (the
Unicode control pictures: ESC becomes ␛), so the text keeps its length and its meaning can
still be read.

`well_formed()` is the other half: a server's JSON may escape half a UTF-16 pair
(`"\\udc9b"`), which Python decodes to a lone surrogate, a code point that is no character
and has no UTF-8. Printed with surrogateescape it becomes a raw byte (0x9b is C1 CSI);
encoded strictly (a tape, a pipe) it raises.
"""

from __future__ import annotations

import re

# C0 controls to their Control Pictures (U+2400 + code), DEL to U+2421; C1 (U+0080 to
# U+009F, read by some terminals as ESC + letter) to U+FFFD: they have no picture.
_PICTURES = {
    **{code: 0x2400 + code for code in range(0x20) if code not in (0x09, 0x0A)},
    0x7F: 0x2421,
    **{code: 0xFFFD for code in range(0x80, 0xA0)},
}


def visible(text: str) -> str:
    """`text` with its control characters (not tab, not newline) made printable."""
    return text.translate(_PICTURES)


# A str holds a surrogate code point only where no character was: JSON decodes a proper
# `\ud83d\ude00` pair to the one character it encodes.
_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> tuple[str, int]:
    """`text` with each lone surrogate (U+D800 to U+DFFF) as U+FFFD, so it has UTF-8, and
    how many there were (0: `text` itself, untouched)."""
    if text.isascii():  # the common case, and a fast test
        return text, 0
    return _SURROGATE.subn("\ufffd", text)
