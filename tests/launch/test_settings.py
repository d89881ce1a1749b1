"""The settings table (config.SETTINGS): every --mepic-* flag, its variable, check, display and doc from one row."""

import dataclasses

import pytest

from sglang_mepic import config, modes
from sglang_mepic.launch import flags_doc, mepic_flags

# A value each setting accepts and one it refuses (None: a switch, or text is never wrong). A setting added to
# the table without a row here fails test_every_setting_has_a_sample, so that it is tested too.
SAMPLES = {
    config.MODE: ("epic-16", "epic-0"),
    config.RECOMPUTE_BLOCKS: ("all", "0"),
    config.COMPILE_SINK: ("bos", "eos"),
    config.PLACEMENT: ("leading", "middle"),
    config.TEXT_MARKUP_SETTING: ("off", "no"),
    config.HOST_TIER_GB: ("0.5", "-1"),
    config.MAX_CHUNKS: ("8", "0"),
    config.AUTO_CHUNK: ("tools+known", "all"),
    config.KNOWN_TEXTS_MB: ("0.5", "0"),
    config.SEPARATOR: (" # # ", "<|chunk|>"),
    config.STORAGE_BACKEND: ("file", None),
    config.STORAGE_DIR: (None, None),  # needs a directory: below
    config.STORAGE_CONFIG: ('{"a": 1}', "[1]"),
    config.STORAGE_TIMEOUT: ("2", "0"),
    config.STORAGE_SECRET: ("k", None),
    config.VERIFY: (None, None),
    config.VERIFY_QUESTIONS: ("3", "0"),
}
STORAGE = (config.STORAGE_BACKEND, config.STORAGE_DIR, config.STORAGE_CONFIG, config.STORAGE_TIMEOUT,
           config.STORAGE_SECRET)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for setting in config.SETTINGS:
        monkeypatch.delenv(setting.env, raising=False)


def test_every_setting_has_a_sample_and_a_flag_of_its_own():
    assert set(SAMPLES) == set(config.SETTINGS)
    assert len({s.flag for s in config.SETTINGS}) == len({s.env for s in config.SETTINGS}) == len(config.SETTINGS)
    assert all(s.flag.startswith("--mepic-") and s.env.startswith("SGLANG_MEPIC_") for s in config.SETTINGS)


@pytest.mark.parametrize("setting", config.SETTINGS, ids=lambda s: s.flag)
def test_a_flag_becomes_its_variable_and_a_bad_value_is_refused_naming_it(setting, tmp_path, capsys):
    good, bad = SAMPLES[setting]
    storage = ["--mepic-storage-dir", str(tmp_path)] if setting in STORAGE else []
    flags = [setting.flag] if setting.switch else [setting.flag, good or str(tmp_path)]
    if setting is config.STORAGE_DIR:
        flags = storage
    rest, env = mepic_flags.split_mepic_flags(["--model-path", "m", *flags, *storage])
    assert rest == ["--model-path", "m"]
    assert env[setting.env] == ("on" if setting.switch else good or str(tmp_path))
    if bad is not None:
        with pytest.raises(SystemExit):
            mepic_flags.split_mepic_flags([setting.flag, bad])
        assert setting.flag in capsys.readouterr().err


@pytest.mark.parametrize("setting", config.SETTINGS, ids=lambda s: s.flag)
def test_the_help_names_the_flag_and_its_default(setting):
    text = " ".join(mepic_flags.mepic_parser().format_help().split())
    assert setting.flag in text
    assert "Default" in setting.help


def test_the_docs_flag_table_is_the_one_the_settings_give():
    doc = flags_doc.DOC.read_text()
    assert flags_doc.rewritten(doc) == doc, "run python -m sglang_mepic.launch.flags_doc"
    for setting in config.SETTINGS:
        assert f"`{setting.env}`" in doc
    with pytest.raises(SystemExit, match="markers"):
        flags_doc.rewritten("no markers here")


def test_a_value_is_parsed_once_per_distinct_text(monkeypatch):
    calls = []
    counted = dataclasses.replace(config.MAX_CHUNKS, env="SGLANG_MEPIC_TEST_COUNTED",
                                  parse=lambda text: calls.append(text) or int(text))
    assert config.read(counted) == 64 and config.read(counted) == 64
    monkeypatch.setenv(counted.env, "9")
    assert config.read(counted) == 9 and config.read(counted) == 9
    monkeypatch.setenv(counted.env, "")  # empty means unset: the default
    assert config.read(counted) == 64
    assert calls == ["64", "9"]


def test_a_bad_variable_set_by_hand_names_the_variable(monkeypatch):
    monkeypatch.setenv(config.MAX_CHUNKS.env, "many")
    with pytest.raises(ValueError, match=r"--mepic-max-chunks 'many'.*\$SGLANG_MEPIC_MAX_CHUNKS"):
        config.max_chunks()
    monkeypatch.setenv(config.PLACEMENT.env, "middle")
    with pytest.raises(ValueError, match="--mepic-placement 'middle': choose from"):
        config.placement()


def test_typed_readers_give_the_table_defaults():
    assert config.mode() == modes.Mode(modes.Kind.MEPIC)
    assert config.recompute_blocks() == 1 and config.placement() is config.Placement.TRAILING
    assert config.compile_sink() == "none" and config.text_markup() is True
    assert config.host_tier_gb() == 0 and config.max_chunks() == 64 and config.auto_chunk() == "off"
    assert config.separator() is None and config.storage_backend() is None and config.storage_config() == {}
    assert config.storage_timeout() == 0.5 and config.storage_secret() is None and config.verify() is False
