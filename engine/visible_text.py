"""Text from a model or a server, made safe to print: control characters shown, never obeyed.

A server decides what its model says, and a model can say `ESC[2J` (clear the screen),
`ESC]0;...` (retitle the window) or `ESC]52;c;...` (write the user's clipboard). Written to
a terminal as they are, those are commands. `visible()` turns every C0 and C1 control
character but tab and newline, and DEL, into a printable stand-in of one character (the
Unicode control pictures: ESC becomes ␛), so the text keeps its length and its meaning can
still be read.
"""

from __future__ import annotations

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
