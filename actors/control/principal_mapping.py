"""Pure: the Kafka principal of a TLS client from its certificate, as Kafka's brokers name it.

A client that presents a certificate on an SSL listener is ``User:`` + a name taken from the
certificate's subject:

1. :func:`subject_dn` writes the subject as Java's ``X500Principal.getName()`` does (RFC 2253,
   the form Kafka matches): RDNs last-first joined by ``,``, multi-valued ones by ``+``; the
   keywords CN, C, L, ST, O, OU, STREET, DC, UID, any other attribute type as its dotted OID
   with the value as ``#`` and the hex of its DER; values with ``, = + < > # ; " \\`` escaped by
   a backslash, NUL as ``\\00``, leading and trailing spaces escaped. It reads the DER of the
   certificate (``SSLObject.getpeercert(binary_form=True)``): the dict form loses the string
   types that decide between the two value forms.
2. :class:`PrincipalMapper` applies Kafka's ``ssl.principal.mapping.rules`` (KIP-371) to it:
   comma-separated rules tried in order, the first that applies names the principal;
   ``DEFAULT`` is the DN itself; ``RULE:pattern/replacement/`` applies when ``pattern`` matches
   the whole DN, and gives the DN with every match replaced (``$1`` a group, ``\\`` quotes the
   next character; a group the pattern lacks is literal text), then ``L`` or ``U`` lower- or
   upper-cases it. No rule applying is SslAuthenticationFailedError: the gateway closes the
   connection. The rules are parsed with Kafka's grammar, so a value Kafka takes is taken here,
   and one Kafka refuses (``default``, ``DEFAULT/L``, ``RULE:a/b``, ``RULE:a/b/LU``) is
   InvalidConfigError.

Patterns are Java regular expressions run by Python's ``re``; the common syntax is the same
(``(?<name>...)`` is translated); a pattern Python cannot compile is InvalidConfigError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from raylog.storage.errors import InvalidConfigError, SslAuthenticationFailedError

__all__ = [
    "ANONYMOUS",
    "DEFAULT_RULES",
    "PrincipalMapper",
    "peer_principal",
    "subject_dn",
]

ANONYMOUS = "User:ANONYMOUS"  # a TLS client without a certificate (Kafka's KafkaPrincipal)
DEFAULT_RULES = "DEFAULT"  # ssl.principal.mapping.rules' default
CERT_BYTES_MAX = 64 << 10  # a client certificate; real ones are a few KiB
RULES_CHARS_MAX = 16 << 10

# --- the subject as RFC 2253 -----------------------------------------------------------------

# The keywords Java's RFC 2253 form uses (AVAKeyword's RFC 2253 set); other types are OIDs.
_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# DirectoryString types written as text: UTF8, Printable, T61, IA5, General, BMP.
_STRING_TAGS = frozenset({0x0C, 0x13, 0x14, 0x16, 0x1B, 0x1E})
_ESCAPED = frozenset(',=+<>#;"\\')
_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06


def _tlv(der: bytes, at: int, end: int) -> tuple[int, int, int]:
    """The (tag, content start, content end) of the DER element at ``at``."""
    if at + 2 > end:
        raise ValueError("truncated DER element")
    tag, first = der[at], der[at + 1]
    if tag & 0x1F == 0x1F:
        raise ValueError("DER tag numbers above 30 have no place in a certificate name")
    at += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or at + count > end:
            raise ValueError("bad DER length")
        length = int.from_bytes(der[at : at + count], "big")
        at += count
    if at + length > end:
        raise ValueError("DER element longer than its container")
    return tag, at, at + length


def _children(der: bytes, tag: int, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """The elements inside the constructed element of ``tag`` whose content is [start, end):
    (tag, element start, content start, content end) each."""
    if tag not in (_SEQUENCE, _SET) and tag & 0x20 == 0:
        raise ValueError("not a constructed DER element")
    out = []
    at = start
    while at < end:
        child_tag, content, child_end = _tlv(der, at, end)
        out.append((child_tag, at, content, child_end))
        at = child_end
    return out


def _oid(body: bytes) -> str:
    arcs: list[int] = []
    value = 0
    for byte in body:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if not arcs or body[-1] & 0x80:
        raise ValueError("bad OID")
    first = min(arcs[0] // 40, 2)
    return ".".join(str(a) for a in [first, arcs[0] - 40 * first, *arcs[1:]])


def _value_text(text: str) -> str:
    escaped = "".join("\\00" if c == "\0" else f"\\{c}" if c in _ESCAPED else c for c in text)
    body = escaped.strip(" \r")
    if not body:  # nothing but spaces: each one escaped
        return "".join(f"\\{c}" for c in escaped)
    lead = len(escaped) - len(escaped.lstrip(" \r"))
    tail = escaped[lead + len(body) :]
    return "".join(f"\\{c}" for c in escaped[:lead]) + body + "".join(f"\\{c}" for c in tail)


def _attribute(der: bytes, start: int, end: int) -> str:
    parts = _children(der, _SEQUENCE, start, end)
    if len(parts) != 2 or parts[0][0] != _OID:
        raise ValueError("bad AttributeTypeAndValue")
    _, _, oid_start, oid_end = parts[0]
    tag, value_at, value_start, value_end = parts[1]
    oid = _oid(der[oid_start:oid_end])
    keyword = _KEYWORDS.get(oid)
    if keyword is None or tag not in _STRING_TAGS:
        return f"{keyword or oid}=#{der[value_at:value_end].hex()}"
    # Java reads every string type's bytes as UTF-8 (BMPString too).
    return f"{keyword}={_value_text(der[value_start:value_end].decode('utf-8', 'replace'))}"


def _name(der: bytes, start: int, end: int) -> str:
    rdns = []
    for tag, _, rdn_start, rdn_end in _children(der, _SEQUENCE, start, end):
        if tag != _SET:
            raise ValueError("bad RelativeDistinguishedName")
        atvs = _children(der, _SET, rdn_start, rdn_end)
        if not atvs or any(t != _SEQUENCE for t, *_ in atvs):
            raise ValueError("bad RelativeDistinguishedName")
        rdns.append("+".join(_attribute(der, s, e) for _, _, s, e in atvs))
    return ",".join(reversed(rdns))


def subject_dn(cert_der: bytes) -> str:
    """The certificate's subject as Java's ``X500Principal.getName()`` (RFC 2253); ValueError
    for bytes that are not a certificate."""
    if len(cert_der) > CERT_BYTES_MAX:
        raise ValueError("certificate too large")
    tag, start, end = _tlv(cert_der, 0, len(cert_der))
    if tag != _SEQUENCE:
        raise ValueError("not a DER certificate")
    parts = _children(cert_der, tag, start, end)
    if not parts or parts[0][0] != _SEQUENCE:
        raise ValueError("not a DER certificate")
    _, _, tbs_start, tbs_end = parts[0]
    fields = _children(cert_der, _SEQUENCE, tbs_start, tbs_end)
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    if len(fields) < 5 or fields[4][0] != _SEQUENCE:
        raise ValueError("not a DER certificate")
    _, _, subject_start, subject_end = fields[4]
    return _name(cert_der, subject_start, subject_end)


# --- ssl.principal.mapping.rules -------------------------------------------------------------

# Kafka's grammar of one rule: DEFAULT, or RULE:pattern/replacement/ with an optional L or U
# (a backslash quotes any character, so an escaped / belongs to the pattern), or anything else
# (which parses as an empty rule, then fails the whole-rule check unless it is empty).
_RULE = (
    r"(?P<default>DEFAULT)"
    r"|RULE:(?P<pattern>(?:\\.|[^\\/])*)/(?P<replacement>(?:\\.|[^\\/])*)/(?P<case>[LU]?).*?"
    r"|(?P<other>.*?)"
)
_SPLIT = re.compile(r"\s*(?P<rule>" + _RULE.replace("?P<", "?P<in_") + r")\s*(?:,\s*|$)")
_PARSE = re.compile(_RULE)
_JAVA_NAMED_GROUP = re.compile(r"\(\?<(?=[A-Za-z])")


@dataclass(frozen=True)
class _Rule:
    """One rule; ``pattern`` None is DEFAULT. ``parts`` is the replacement: literal text (str)
    and group numbers (int)."""

    text_pattern: str | None
    text_replacement: str
    case: str
    pattern: re.Pattern[str] | None
    parts: tuple[str | int, ...]  # literal text, group numbers

    def __str__(self) -> str:  # as Kafka writes it (its SslPrincipalMapper.toString)
        if self.pattern is None:
            return "DEFAULT"
        case = f"/{self.case}" if self.case else ""
        return f"RULE:{self.text_pattern}/{self.text_replacement}{case}"

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        name = self.pattern.sub(self._expand, dn)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name

    def _expand(self, match: re.Match[str]) -> str:
        return "".join(p if isinstance(p, str) else match.group(p) or "" for p in self.parts)


def _replacement(text: str, rule: str, groups: int, names: dict[str, int]) -> tuple[str | int, ...]:
    """A Java replacement string as parts: ``\\c`` is ``c``, ``${name}`` a named group, ``$n``
    group n (its digits taken while they name a group; a group beyond the pattern's is literal
    text, as Kafka's rule mapper makes it)."""
    parts: list[str | int] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            literal.append(text[i + 1])
            i += 2
            continue
        if c != "$":
            literal.append(c)
            i += 1
            continue
        if text.startswith("{", i + 1):
            close = text.find("}", i + 2)
            name = text[i + 2 : close] if close > 0 else ""
            if name not in names:
                raise InvalidConfigError(
                    f"ssl.principal.mapping.rules: no group ${{{name}}} in {rule}"
                )
            ref = names[name]
            i = close + 1
        else:
            digits = re.match(r"\d+", text[i + 1 :])
            if digits is None:
                raise InvalidConfigError(
                    f"ssl.principal.mapping.rules: '$' names no group in {rule} (quote it: \\$)"
                )
            run = digits.group()
            if groups == 0:
                raise InvalidConfigError(
                    f"ssl.principal.mapping.rules: ${run} but the pattern has no groups in {rule}"
                )
            number, taken = int(run[0]), 1
            while taken < len(run) and number * 10 + int(run[taken]) <= groups:
                number, taken = number * 10 + int(run[taken]), taken + 1
            if number > groups:  # no such group: the text stays as written
                literal.append("$")
                i += 1
                continue
            ref = number
            i += 1 + taken
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(ref)
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def _rule(text: str) -> _Rule | None:
    """One rule as Kafka parses it; None for an empty one (ignored)."""
    m = _PARSE.match(text)
    if m is None or m.end() != len(text):
        unmatched = text[m.end() :] if m else text
        raise InvalidConfigError(
            f"ssl.principal.mapping.rules: invalid rule {text!r}, unmatched {unmatched!r}"
        )
    if m.group("default") is not None:
        return _Rule(None, "", "", None, ())
    pattern_text = m.group("pattern")
    if pattern_text is None:
        return None
    try:
        pattern = re.compile(_JAVA_NAMED_GROUP.sub("(?P<", pattern_text))
    except re.error as e:
        raise InvalidConfigError(
            f"ssl.principal.mapping.rules: bad pattern {pattern_text!r}: {e}"
        ) from None
    replacement = m.group("replacement")
    parts = _replacement(replacement, text, pattern.groups, dict(pattern.groupindex))
    return _Rule(pattern_text, replacement, m.group("case"), pattern, parts)


@dataclass(frozen=True)
class PrincipalMapper:
    """``ssl.principal.mapping.rules``, parsed (:meth:`from_rules`)."""

    rules: tuple[_Rule, ...]

    @classmethod
    def from_rules(cls, rules: str | None) -> PrincipalMapper:
        """Parses the config value (None: ``DEFAULT``); InvalidConfigError names a bad rule."""
        text = DEFAULT_RULES if rules is None else rules
        if len(text) > RULES_CHARS_MAX:
            raise InvalidConfigError("ssl.principal.mapping.rules is too long")
        found = (_rule(m.group("rule")) for m in _SPLIT.finditer(text.strip()))
        return cls(tuple(r for r in found if r is not None))

    def __str__(self) -> str:
        return "[" + ", ".join(str(r) for r in self.rules) + "]"

    def name(self, dn: str) -> str:
        """The principal name of ``dn`` (RFC 2253): the first rule that applies; none is
        SslAuthenticationFailedError."""
        for rule in self.rules:
            found = rule.apply(dn)
            if found is not None:
                return found
        raise SslAuthenticationFailedError(f"no ssl.principal.mapping.rules rule applies to {dn}")


def peer_principal(cert_der: bytes | None, mapper: PrincipalMapper) -> str:
    """``User:`` + the mapped name of a TLS client's certificate (DER); ``User:ANONYMOUS``
    without one. SslAuthenticationFailedError when no rule applies or the bytes are not a
    certificate."""
    if cert_der is None:
        return ANONYMOUS
    try:
        dn = subject_dn(cert_der)
    except ValueError as e:
        raise SslAuthenticationFailedError(f"the client certificate does not parse: {e}") from None
    return "User:" + mapper.name(dn)
