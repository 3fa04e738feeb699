"""The one rule for what looks like a secret, and what the identity records do with it (docs/bundle.md, "What
is never stored").

Stdlib only (the login node imports it at every submission).

* **Files** (:class:`SecretRule`): a name that looks like a credential (:data:`DEFAULT_SECRET_FILES`: private
  keys, ``.env`` and ``.env.*``, ``*.pem``, ``*.key``, ``credentials*``, ``.netrc``, ``.pgpass``, token files
  ...), a name the user's deny-list matches (``[run] secret_patterns`` of the submit TOML, added to the
  defaults), or content that begins with a ``-----BEGIN ... PRIVATE KEY-----`` header. The code capture and the
  snapshot record such a file's name and hash, never its bytes (``withheld`` says why).
* **Names** (:func:`secret_name`): an environment variable, a command-line flag or a ``KEY=VALUE`` argument
  whose name has a word such as ``TOKEN``, ``SECRET``, ``PASSWORD``, ``KEY``, or starts with ``AWS_``: its value
  is recorded as :data:`REDACTED` (:func:`redact_env`, :func:`redact_argv`).
* **URLs** (:func:`strip_credentials`, :func:`redact_text`): ``user:password@`` and tokens in a URL's user part
  or query string are dropped.

The user's deny-list reaches the capture through :func:`using_patterns` (``hpctrain.identity.capture_submit``
and ``capture_start`` set it from the submission's config) or an explicit ``secret_patterns`` argument.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import re
import typing as tp
import urllib.parse
from dataclasses import dataclass

from hpctrain._files import shorten
from hpctrain.errors import UsageError

__all__ = [
    "REDACTED",
    "DEFAULT_SECRET_FILES",
    "SecretRule",
    "check_secret_patterns",
    "using_patterns",
    "active_rule",
    "secret_name",
    "redact_env",
    "redact_argv",
    "redact_text",
    "strip_credentials",
]

REDACTED = "<redacted>"
"""What a secret value is recorded as."""

DEFAULT_SECRET_FILES = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    "id_ecdsa_sk",
    "id_ed25519_sk",
    "credentials*",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".pypirc",
    ".git-credentials",
    "*.token",
)
"""The file names never stored (matched case-insensitively against the file's own name, not its directory),
and token files besides: ``token``, ``hf_token``, ``.hf_token``, ``api-token.txt``, ``access_token.json`` (a name
that is or ends with ``token`` after ``.``, ``_`` or ``-``, optionally with a data extension such as ``.txt``,
``.json``, ``.yaml``, ``.cfg``). ``tokenizer.json``, ``special_tokens_map.json`` or ``token.py`` are not."""
_EXACT = frozenset(n for n in DEFAULT_SECRET_FILES if "*" not in n)
_GLOBS = tuple(n for n in DEFAULT_SECRET_FILES if "*" in n)
_TOKEN_FILE = re.compile(
    r"(?:^|[._-])(?:access|auth|api|refresh|bearer)?[_-]?token(?:\.(?:txt|json|ya?ml|cfg|conf|ini|dat))?$"
)
_KEY_HEADER = re.compile(
    rb"\A(?:\xef\xbb\xbf)?\s*(?:-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-)"
)
HEAD_BYTES = 512
"""Bytes of a file's beginning the content rule looks at."""
DIFF_KEY_REGEX = "^-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY"
"""The extended regex ``git diff -G`` is given: a changed file whose diff adds or removes such a line is withheld."""
MAX_PATTERNS = 1000
MAX_PATTERN_CHARS = 1000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_secret_patterns(value: tp.Any, where: str = "[run] secret_patterns") -> tp.Tuple[str, ...]:
    """The user's deny-list as a tuple of glob patterns; anything else is one UsageError line naming ``where``."""
    example = 'e.g. secret_patterns = ["*.secret", "mycreds/*"]'
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise UsageError(
            f"{where} must be a list of file name patterns (strings), {example}; got {shorten(repr(value))}"
        )
    if len(value) > MAX_PATTERNS:
        raise UsageError(f"{where}: {len(value)} patterns; give at most {MAX_PATTERNS} (a glob can cover many files)")
    for p in value:
        if not p.strip("/") or _CONTROL.search(p) or len(p) > MAX_PATTERN_CHARS:
            raise UsageError(
                f"{where}: {shorten(repr(p))} is not a usable pattern: give a non-empty glob of one line "
                f"(at most {MAX_PATTERN_CHARS} characters), {example}"
            )
    return tuple(value)


@dataclass(frozen=True)
class SecretRule:
    """Whether a file of a code capture looks like a credential. ``patterns``: the user's deny-list, globs
    matched case-sensitively: one without ``/`` (a trailing one aside) matches the file's name or the name of any
    directory above it; one with ``/`` matches the path from the root of the repository or package (a leading
    ``/`` is ignored), or a directory holding the file."""

    patterns: tp.Tuple[str, ...] = ()

    def name(self, rel: str) -> tp.Optional[str]:
        """Why the path ``rel`` (``/``-separated, relative to its root) is withheld by its name, or None."""
        parts = [p for p in rel.split("/") if p]
        if not parts:
            return None
        base = parts[-1].lower()
        if base in _EXACT:
            return f"its name looks like a credential ({base})"
        glob = next((g for g in _GLOBS if fnmatch.fnmatchcase(base, g)), None)
        if glob is not None:
            return f"its name looks like a credential ({glob})"
        if _TOKEN_FILE.search(base):
            return "its name looks like a token file"
        for pattern in self.patterns:
            p = pattern.strip("/")
            if "/" in pattern.rstrip("/"):  # anchored at the root: the path, or a directory holding it
                path = "/".join(parts)
                hit = fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(path, p + "/*")
            else:
                hit = any(fnmatch.fnmatchcase(part, p) for part in parts)
            if hit:
                return f"[run] secret_patterns {pattern!r}"
        return None

    @staticmethod
    def content(head: tp.Optional[bytes]) -> tp.Optional[str]:
        """Why a file whose first bytes are ``head`` is withheld (a private key), or None."""
        if head and _KEY_HEADER.match(head[:HEAD_BYTES]):
            return "its content is a private key"
        return None

    def file(self, rel: str, head: tp.Optional[bytes] = None) -> tp.Optional[str]:
        return self.name(rel) or self.content(head)


_ACTIVE: contextvars.ContextVar[tp.Tuple[str, ...]] = contextvars.ContextVar("hpctrain_secret_patterns", default=())


@contextlib.contextmanager
def using_patterns(patterns: tp.Optional[tp.Sequence[str]]) -> tp.Iterator[tp.Tuple[str, ...]]:
    """The user's deny-list in effect for the code captures inside the ``with`` (validated first)."""
    token = _ACTIVE.set(check_secret_patterns(patterns))
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)


def active_rule(patterns: tp.Optional[tp.Sequence[str]] = None) -> SecretRule:
    """The rule with ``patterns`` (validated), else with the deny-list :func:`using_patterns` set."""
    if patterns is None:
        return SecretRule(_ACTIVE.get())
    return SecretRule(check_secret_patterns(patterns))


# ----------------------------------------------------------------------------------------------- names, values
_SUFFIX_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "JWT")
_WHOLE_WORDS = frozenset({"PASS", "AUTH", "AUTHORIZATION", "CREDENTIAL", "CREDENTIALS", "COOKIE", "PAT"})


def secret_name(name: str) -> bool:
    """Whether a variable, flag or key named ``name`` holds a secret: one of its words (split at anything not a
    letter or digit, case-insensitive) is or ends with TOKEN, SECRET, PASSWORD, PASSWD, PASSPHRASE, KEY or JWT
    (``HF_TOKEN``, ``apiKey``, ``--api-key``, ``AWS_SECRET_ACCESS_KEY``), or is PASS, AUTH, AUTHORIZATION,
    CREDENTIAL(S), COOKIE or PAT; or it starts with ``AWS_``. ``--max-tokens`` and ``TOKENIZERS_PARALLELISM`` do
    not."""
    upper = str(name).upper().lstrip("-")
    if upper.startswith("AWS_"):
        return True
    for word in re.split(r"[^A-Z0-9]+", upper):
        if word and (word in _WHOLE_WORDS or word.endswith(_SUFFIX_WORDS)):
            return True
    return False


def strip_credentials(url: str) -> str:
    """A remote URL without the secrets people put in them: ``https://user:token@host/x`` -> ``https://host/x``
    (the user goes too on http(s), where it is often a token), a password in any scheme, and a query string
    on http(s) (``?private_token=...``). scp-like ``git@host:org/repo.git`` has no secret and stays."""
    if "://" not in url:
        return url
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return re.sub(r"://[^/@]*@", "://", url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        web = parts.scheme.lower() in ("http", "https", "ftp", "ftps")
        if web or ":" in userinfo:
            netloc = host if web else f"{userinfo.split(':', 1)[0]}@{host}"
    query = "" if parts.scheme.lower() in ("http", "https") else parts.query
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")
_QUERY_ITEM = re.compile(r"([?&;])([^=&;#\s]+)=([^&;#\s]*)")


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URL in it dropped (:func:`strip_credentials`) and the value of
    every secret-named query item (``?token=...``) in it redacted."""
    if "://" in text:
        text = _URL.sub(lambda m: strip_credentials(m.group(0)), text)
    if "=" in text and ("?" in text or "&" in text):
        text = _QUERY_ITEM.sub(
            lambda m: f"{m.group(1)}{m.group(2)}={REDACTED}" if secret_name(m.group(2)) else m.group(0), text
        )
    return text


def redact_env(env: tp.Mapping[str, str]) -> tp.Dict[str, str]:
    """Recorded environment variables: a secret-named one's value is :data:`REDACTED`, URLs lose credentials."""
    return {k: REDACTED if secret_name(k) else redact_text(str(v)) for k, v in env.items()}


_KEY_ARG = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


def redact_argv(argv: tp.Sequence[str]) -> tp.List[str]:
    """A command line as recorded: the value of a secret-named flag (``--token X``, ``--api-key=X``) and of a
    ``KEY=VALUE`` argument with a secret-named key is :data:`REDACTED`; URLs lose their credentials. The word
    after a secret-named flag counts as its value unless it is another ``--flag``."""
    out: tp.List[str] = []
    value_next = False
    for arg in argv:
        arg = str(arg)
        if value_next:
            value_next = False
            if not arg.startswith("--"):
                out.append(REDACTED)
                continue
        if arg.startswith("-") and len(arg) > 1 and arg != "--":
            flag, eq, _ = arg.partition("=")
            if secret_name(flag):
                out.append(f"{flag}={REDACTED}" if eq else arg)
                value_next = not eq
                continue
        else:
            key, eq, _ = arg.partition("=")
            if eq and _KEY_ARG.fullmatch(key) and secret_name(key):
                out.append(f"{key}={REDACTED}")
                continue
        out.append(redact_text(arg))
    return out
