"""Text folding before any leak rule: what a reader sees, not how it is encoded.

A policy that is penalised for writing "supported" can write it with a zero-width space inside, a soft hyphen,
Cyrillic look-alike letters, full-width or mathematical letters, accents, or digits for letters ("supp0rted"). A
responder LM reads all of these as the word; a regex does not. ``fold`` undoes them, in this order:

1. Unicode NFKC (full-width, mathematical alphanumerics, ligatures, circled letters → their plain letters);
2. format and invisible characters removed (category Cf: zero-width spaces and joiners, soft hyphen, word joiner, BOM,
   bidi controls; variation selectors; Hangul and Braille blanks);
3. accents and other combining marks removed (NFD, then categories Mn/Me dropped): "réfuté" → "refute";
4. letters of other scripts that look like a Latin letter → that letter (Unicode's confusables table, through
   ``confusable_homoglyphs``; case kept): Cyrillic "ѕирроrt" → "support", Greek "Α" → "A";
5. digits and symbols between two letters → the letters they stand for ("r3fut3d" → "refuted"; "F1", "2024",
   "B12", "3rd" are untouched: no letter on both sides).

``variants`` gives the texts the rules run on: the folded one, and (only when it differs) the text after steps 1–3,
so words of a script that really is another language are still matched by that language's lexicon.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

# Blocks whose letters Unicode lists as confusable with Latin ones (Greek, Cyrillic, Armenian, Cherokee, IPA and
# phonetic extensions, Latin extensions, letterlike symbols, Lisu, Cyrillic extensions).
_CONFUSABLE_BLOCKS = (
    (0x0180, 0x02AF),
    (0x0370, 0x058F),
    (0x13A0, 0x13FF),
    (0x1D00, 0x1DBF),
    (0x2100, 0x214F),
    (0xA4D0, 0xA4FF),
    (0xA640, 0xA69F),
    (0xA720, 0xA7FF),
    (0xAB30, 0xAB6F),
)
_INVISIBLE = {0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x034F}
_LEET = {"0": "o", "1": "l", "3": "e", "4": "a", "5": "s", "6": "g", "7": "t", "8": "b", "9": "g", "@": "a", "$": "s"}
_INNER = re.compile(r"(?<=[A-Za-z])[0-9@$|!]+(?=[A-Za-z])|\b[0-9@$](?=[A-Za-z]{3,})(?!(?:st|nd|rd|th)\b)")
# Regional indicator symbols (flag letters, "🇧") read as the capital letters they show.
_REGIONAL = {cp: chr(ord("A") + cp - 0x1F1E6) for cp in range(0x1F1E6, 0x1F200)}


@lru_cache(maxsize=1)
def _confusable_table() -> dict[int, str]:
    """Code point → the ASCII letter it looks like (upper case for upper case letters where Unicode lists one)."""
    from confusable_homoglyphs import confusables

    table: dict[int, str] = {}
    for lo, hi in _CONFUSABLE_BLOCKS:
        for cp in range(lo, hi + 1):
            ch = chr(cp)
            if not ch.isalpha():
                continue
            # Latin letters Unicode does not list as confusable with themselves: small capitals, letters with a
            # stroke or hook ("ᴛʀᴜᴇ", "ƀ").
            named = re.fullmatch(
                r"LATIN (SMALL |CAPITAL )?LETTER (SMALL CAPITAL )?([A-Z])( WITH .*)?", unicodedata.name(ch, "")
            )
            if named:
                table[cp] = named.group(3) if named.group(1) == "CAPITAL " else named.group(3).lower()
                continue
            found = confusables.is_confusable(ch, preferred_aliases=["latin"])
            glyphs = [h["c"] for h in found[0]["homoglyphs"]] if found else []
            ascii_letters = [g for g in glyphs if len(g) == 1 and g.isascii() and g.isalpha()]
            if not ascii_letters:
                continue
            # Unicode maps both "I" and "l" look-alikes to "l"; an upper-case source reads as "I".
            letter = ascii_letters[0]
            table[cp] = "I" if ch.isupper() and letter == "l" else (letter.upper() if ch.isupper() else letter)
    return table


def _strip(text: str) -> str:
    """Steps 1–3: NFKC, invisible characters out, combining marks out."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(
        ch
        for ch in unicodedata.normalize("NFD", text)
        if unicodedata.category(ch) not in ("Cf", "Mn", "Me") and ord(ch) not in _INVISIBLE
    )
    return unicodedata.normalize("NFC", text)


def _leet(match: re.Match, one: str = "l") -> str:
    return "".join(one if ch in "1|!" else _LEET.get(ch, ch) for ch in match.group(0))


def fold(text: str, *, one: str = "l") -> str:
    """The text as a reader sees it (steps 1–5 above); case is kept.

    >>> fold("su\\u200bp\\u00adported, ѕuрроrtеd, ｓｕｐｐｏｒｔｅｄ, 𝐬𝐮𝐩𝐩𝐨𝐫𝐭𝐞𝐝, réfuté, r3fut3d, Say В")
    'supported, supported, supported, supported, refute, refuted, Say B'
    >>> fold("F1 (2024) says B12 and vitamin D; the 3rd memory")
    'F1 (2024) says B12 and vitamin D; the 3rd memory'
    """
    letters = _strip(text).translate(_REGIONAL).translate(_confusable_table())
    return _INNER.sub(lambda m: _leet(m, one), letters)


def variants(text: str) -> tuple[str, ...]:
    """``fold(text)``, then (where they differ) the text after steps 1–3 only, the folded text with an inner "1"
    read as "i" instead of "l" ("fa1se" → "false", "f1nal" → "final"), and the folded text with hyphens inside words
    and spaces or dots between single letters taken out ("in-sufficient", "t r u e").

    >>> variants("fa1se f1nal")
    ('false flnal', 'fa1se f1nal', 'faise final')
    >>> variants("t r u e, in-sufficient")[-1]
    'true, insufficient'
    """
    stripped = _strip(text)
    folded = fold(text)
    joined = re.sub(r"(?<=\w)[-\u2010\u2011](?=\w)", "", folded)  # "in-sufficient" → "insufficient"
    joined = re.sub(r"\b(?:[A-Za-z][ .]){2,}[A-Za-z]\b", lambda m: re.sub(r"[ .]", "", m.group(0)), joined)  # t r u e
    out = [folded, stripped, fold(text, one="i"), joined]
    return tuple(dict.fromkeys(out))
