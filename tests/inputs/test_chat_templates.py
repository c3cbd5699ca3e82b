"""Campaign 3: a checkpoint's chat template is code. Rendered sandboxed and bounded, it
gives transformers' exact text on ordinary templates, and every hostile one is a coded
error naming the template's file (exit 2 through `xconf-run`), never a hang or a traceback.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import snapshot
from tests.inputs.datasets import write_jsonl
from xconf.adapters.models import chat_template
from xconf.errors import ConfigError

# SmolLM2-135M-Instruct's ChatML template (the real default's), and Qwen2.5's (tools, a
# default system prompt, tojson, loop variables, whitespace control).
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. '
            'You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
        or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Question: what is two plus three?"}],
    [
        {"role": "system", "content": "You count.\n  Indented\u2028line; {{ not code }}"},
        {"role": "user", "content": "Once upon a time"},
        {"role": "assistant", "content": "a small model"},
        {"role": "user", "content": "é ü <b>&amp;</b> \\n"},
    ],
]

HOSTILE: dict[str, str] = {
    "endless_loop": (
        "{% for a in range(60000) %}{% for b in range(60000) %}{% for c in range(60000) %}"
        "{% endfor %}{% endfor %}{% endfor %}"
    ),
    "raises": "{{ raise_exception('this template refuses: \x1b]52;c;Zm9v\x07') }}",
    "syntax_error": "{% for message in messages %}{{ message['content'] }",
    "include": "{% include '/etc/passwd' %}",
    "import": "{% import '/etc/passwd' as p %}",
    "extends": "{% extends '/etc/passwd' %}",
    "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "subclasses_attr": "{{ ()|attr('__class__')|attr('__base__')|attr('__subclasses__')() }}",
    "huge_repeat": "{{ 'x' * 1000000000 }}",
    "huge_power": "{{ 10 ** 10 ** 10 }}",
    "huge_filter": "{{ 'x' | center(1000000000) }}",
    "huge_output": "{% for a in range(60000) %}{{ 'y' * 1000 }}{% endfor %}",
    "huge_replace": "{{ messages[0]['content'].replace('', 'x' * 900000) }}",
    "huge_indent": "{{ ('a\\n' * 400000) | indent(1000) }}",
    "huge_expandtabs": "{{ ('\\t' * 400000).expandtabs(1000) }}",
    "huge_percent": "{{ '%1000000000d' % 1 }}",
    "huge_format": "{{ '{:1000000000}'.format(1) }}",
    "huge_star_width": "{{ '%*d' % (1000000000, 1) }}",
    "huge_format_map": "{{ '{x:1000000000}'.format_map({'x': 1}) }}",
    "huge_json_indent": "{{ messages | tojson(indent=1000000) }}",
    "huge_format_filter": "{{ '%1000000000s' | format('x') }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "undefined_call": "{{ nothing() }}",
}


def _tokenizer(checkpoints: dict[str, Path], tmp_path: Path, template: str) -> tuple[Any, Path]:
    from transformers import AutoTokenizer

    directory = tmp_path / "tok"
    if directory.exists():
        shutil.rmtree(directory)
    shutil.copytree(checkpoints["qwen3"], directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = template
    config_file.write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(directory), config_file


@pytest.mark.parametrize("template", [SMOLLM2, QWEN25, chat_template.__name__], ids=str.__len__)
def test_ordinary_templates_render_exactly_as_transformers(
    checkpoints: dict[str, Path], tmp_path: Path, template: str
) -> None:
    if template == chat_template.__name__:  # the template xconf's own tiny models ship
        from xconf.adapters.models.tokenizer import CHAT_TEMPLATE

        template = CHAT_TEMPLATE
    tok, _ = _tokenizer(checkpoints, tmp_path, template)
    for chat in CHATS:
        expected = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert chat_template.render_chat(tok, chat) == expected
    # With tools, as transformers passes them (a JSON schema list).
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    expected = tok.apply_chat_template(
        CHATS[0], tools=tools, tokenize=False, add_generation_prompt=True
    )
    context = {
        **tok.special_tokens_map,
        "messages": CHATS[0],
        "tools": tools,
        "documents": None,
        "add_generation_prompt": True,
    }
    assert chat_template.render_template(template, context, source="t") == expected


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_a_coded_error_naming_the_file(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(chat_template, "RENDER_TIMEOUT_S", 0.5)
    tok, config_file = _tokenizer(checkpoints, tmp_path, HOSTILE[name])
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        chat_template.render_chat(tok, CHATS[0], where="rows.jsonl:row 0")
    assert time.monotonic() - started < 10
    assert refused.value.code == "tokenizer.chat_template"
    assert str(config_file) in refused.value.message and refused.value.path == "rows.jsonl:row 0"
    if name == "raises":
        assert "this template refuses" in refused.value.message


def test_private_attributes_read_as_nothing(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    tok, _ = _tokenizer(
        checkpoints, tmp_path, "{{ raise_exception.__globals__ }}|{{ 1 .__class__ }}"
    )
    assert chat_template.render_chat(tok, CHATS[0]) == "|"  # the sandbox hides them


@pytest.mark.slow
def test_hostile_templates_through_xconf_run_exit_2_and_write_nothing(
    checkpoints: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from xconf.cli import hydra_app

    monkeypatch.setattr(chat_template, "RENDER_TIMEOUT_S", 1.0)
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"messages": CHATS[0]}])
    for name in ("endless_loop", "include", "subclasses", "syntax_error", "raises"):
        model = tmp_path / f"ckpt-{name}"
        shutil.copytree(checkpoints["qwen3"], model)
        config_file = model / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["chat_template"] = HOSTILE[name]
        config_file.write_text(json.dumps(config))
        before = snapshot(model)
        out = tmp_path / f"out-{name}"
        cwd = tmp_path / f"cwd-{name}"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        argv = [
            "xconf-run",
            "+experiment=s2_cpu",
            "runtime=vllm_hf",
            f"runtime.model.path={model}",
            f"identity.recipe.dataset.path={rows}",
            f"output_root={out}",
        ]
        monkeypatch.setattr(sys, "argv", argv)
        capsys.readouterr()
        started = time.monotonic()
        with pytest.raises(SystemExit) as info:
            hydra_app.main()
        err = capsys.readouterr().err
        assert time.monotonic() - started < 30, name
        assert info.value.code == 2, (name, err)
        assert "[tokenizer.chat_template]" in err and str(config_file) in err, (name, err)
        assert "Traceback" not in err and "\x1b" not in err, (name, err)
        assert not out.exists() and snapshot(model) == before
