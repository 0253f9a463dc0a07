"""The shell renderers (cpuperf.render.shell) over hostile NAMES and values, in real shells (issue 32).

A name or value may come from a plan or facts file made elsewhere. Properties, for every format read by sh,
bash, interactive bash, zsh, dash and fish: nothing runs (a canary file stays absent, also at the next prompt
of an interactive bash: PROMPT_COMMAND, PS0, PS1), a name that is not a plain variable name or that a shell owns
is never written, and in the shells a format is meant for every written variable reads back byte-identical.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cpuperf.decide import runtime_env as envplan
from cpuperf.render import shell as render

POSIX = {"sh": ["sh", "-c"], "bash": ["bash", "--norc", "--noprofile", "-c"], "zsh": ["zsh", "-f", "-c"],
         "dash": ["dash", "-c"]}
FORMATS = ("sh", "bash", "zsh", "fish", "dotenv")
NATIVE = {"sh": ("sh", "bash", "zsh", "dash", "bash-i"), "bash": ("sh", "bash", "zsh", "dash", "bash-i"),
          "zsh": ("bash", "zsh", "dash"), "fish": ("fish",), "dotenv": ("sh", "bash", "dash")}

NAME_FRAGMENTS = ["OMP_NUM_THREADS", "CCL_X", "PROMPT_COMMAND", "PS0", "PS1", "PS2", "PROMPT", "RPROMPT", "ZDOTDIR",
                  "PYTHONSTARTUP", "fish_function_path", "fish_user_paths", "BASH_ENV", "ENV", "IFS", "PATH",
                  "\n", "\x00", "\u2028", "\x1b[2J", "\r", "=", " ", "$(touch {c}/n)", ";", "1"]
VALUE_FRAGMENTS = ["'", '"', "\\", "\\'", "$(touch {c}/d)", "`touch {c}/t`", "\n", "\x00", "\u2028", "\u2029",
                   "\x1b]0;title\x07", "\x9b", "\x7f", "; touch {c}/s #", "%self", "!", "~", "=", "2", "0-3,8"]
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
NAMES = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
                  st.lists(st.one_of(st.sampled_from(NAME_FRAGMENTS), TEXT), min_size=1, max_size=3).map("".join))
VALUES = st.lists(st.one_of(st.sampled_from(VALUE_FRAGMENTS), TEXT), min_size=0, max_size=5).map("".join)


ENV = shutil.which("env") or "/usr/bin/env"  # by path: a written PATH must not hide it


def _need_shells() -> None:
    for shell in ("sh", "bash", "zsh", "dash", "fish"):
        if shutil.which(shell) is None:
            pytest.skip(f"{shell} is not installed (apt-get install -y zsh fish dash)")


def _parse_env0(path: Path) -> Dict[str, str]:
    out = {}
    for item in path.read_bytes().split(b"\0"):
        name, sep, value = item.decode("utf-8", "surrogateescape").partition("=")
        if sep:
            out[name] = value
    return out


def _evaluate(shell: str, code: Path, tmp: Path, dotenv: bool) -> Dict[str, str]:
    """Read the code as users do: eval in POSIX shells (`set -a` for a dotenv), source in fish, and in an
    interactive bash sourced at a prompt, followed by two more prompts (PROMPT_COMMAND, PS0 and PS1 run there)."""
    dump = tmp / f"env0.{shell}"
    dump.unlink(missing_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": str(tmp)}
    if shell == "bash-i":
        script = f"{'set -a; ' if dotenv else ''}. {code}\ntrue\n{ENV} -0 > {dump}\nexit\n"
        subprocess.run(["bash", "--norc", "--noprofile", "-i"], input=script, env=env, cwd=tmp, capture_output=True,
                       text=True, timeout=60)
    elif shell == "fish":
        subprocess.run(["fish", "--no-config", "-c", f"source {code}; {ENV} -0 > {dump}"], env=env, cwd=tmp,
                       capture_output=True, timeout=60)
    else:
        body = ("set -a; " if dotenv else "") + f'eval "$(cat {code})"; {ENV} -0 > {dump}'
        subprocess.run(POSIX[shell] + [body], env=env, cwd=tmp, capture_output=True, timeout=60)
    return _parse_env0(dump) if dump.exists() else {}


def _written(pairs: List[tuple]) -> Dict[str, str]:
    """What the renderer may write: a plain, unowned name with a value every shell reads alike."""
    final: Dict[str, str] = {}
    for name, value in pairs:
        if envplan.valid_name(name) and envplan.shell_safe(value) is None:
            final[name] = value
    return final


def test_names_and_values_are_written_exactly_or_not_at_all_in_every_shell(tmp_path):
    _need_shells()
    canary = tmp_path / "canary"
    canary.mkdir()

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(st.lists(st.tuples(NAMES, VALUES), min_size=1, max_size=4), VALUES)
    def check(pairs: List[tuple], header: str) -> None:
        fill = lambda v: v.replace("{c}", str(canary))  # noqa: E731
        pairs = [(fill(n), fill(v)) for n, v in pairs]
        final = dict(pairs)
        env = render.CclEnv("gloo", "", final, tuple(envplan.EnvVar(n, v, "plan", fill(header)) for n, v in pairs),
                            (), (), (), header=fill(header))
        expected = _written(list(final.items()))
        assert render.to_json(env)["env"] == expected
        for fmt in FORMATS:
            text = render.render(env, fmt)
            assert all(ch == "\n" or ch.isprintable() for ch in text), fmt  # no control character, no U+2028
            code = tmp_path / f"code.{fmt}"
            code.write_text(text, encoding="utf-8")
            for shell in ("sh", "bash", "bash-i", "zsh", "dash", "fish"):
                got = _evaluate(shell, code, tmp_path, fmt == "dotenv")
                assert list(canary.iterdir()) == [], (fmt, shell, text)
                if shell in NATIVE[fmt]:
                    for name, value in expected.items():
                        if name == "PATH" and shell == "fish":
                            continue  # fish keeps PATH as a list of directories ('' reads back as '.')
                        assert got.get(name) == value, (fmt, shell, name)
            assigned = [re.match(r"(?:export |set -gx )?([^= ]*)", line).group(1)  # type: ignore[union-attr]
                        for line in text.splitlines() if line and not line.startswith("#")]
            assert assigned == list(expected), (fmt, text)  # only plain, unowned names are ever written

    check()


@pytest.mark.parametrize("name", ["PROMPT_COMMAND", "PS0", "PS1", "fish_function_path", "ZDOTDIR", "PYTHONSTARTUP",
                                  "CCL_X\n", "OMP_NUM_THREADS\n", "BASH_ENV"])
def test_shell_owned_and_newline_names_are_never_written(name):
    env = render.CclEnv("gloo", "", {name: "touch /tmp/cpuperf-pwned"}, (), (), (), ())
    for fmt in FORMATS:
        assert "touch" not in render.render(env, fmt)
    assert render.to_json(env)["env"] == {}


@given(NAMES, VALUES)
@settings(max_examples=300, deadline=None)
def test_each_renderer_writes_one_plain_line_or_refuses(name, value):
    from cpuperf.errors import UsageError

    for fmt, line in render.RENDERERS.items():
        try:
            text = line(name, value)
        except UsageError:
            assert not envplan.valid_name(name) or envplan.shell_safe(value) is not None
            continue
        assert envplan.valid_name(name) and envplan.shell_safe(value) is None, fmt
        assert "\n" not in text and all(ch.isprintable() for ch in text)
        assert re.match(r"(?:export |set -gx )?([^= ]*)", text).group(1) == name  # type: ignore[union-attr]
