"""The settings table (config.SETTINGS): every --mepic-* flag, its variable, check, display and doc from one row."""

import dataclasses

import pytest

from sglang_mepic import config, env, modes
from sglang_mepic.launch import flags_doc, mepic_flags

# A value each setting accepts and one it refuses (None: a switch, or text is never wrong). A setting added to
# the table without a row here fails test_every_setting_has_a_sample, so that it is tested too.
SAMPLES = {
    config.MODE: ("epic-16", "epic-0"),
    config.RECOMPUTE_BLOCKS: ("all", "0"),
    config.COMPILE_SINK: ("bos", "eos"),
    config.PLACEMENT: ("leading", "middle"),
    config.TEXT_MARKUP: ("off", "no"),
    config.HOST_TIER_GB: ("0.5", "-1"),
    config.CHUNK_STORE: ("pool", "disk"),  # host needs epic-K and a host tier: test_a_bad_variable_set_by_hand
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


def test_a_process_reads_its_settings_once(monkeypatch):
    """Built from the environment when the process starts; a variable set later changes nothing until the
    process reads them again (the launcher does once the flags are variables), and no part can change them."""
    monkeypatch.setenv(config.MAX_CHUNKS.env, "9")
    first = env.reload()
    monkeypatch.setenv(config.MAX_CHUNKS.env, "10")
    assert env.settings() is first and first.max_chunks == 9
    assert env.reload().max_chunks == 10
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.max_chunks = 11
    monkeypatch.setenv(config.MAX_CHUNKS.env, "")  # empty means unset: the default
    assert env.reload().max_chunks == 64


def test_a_bad_variable_set_by_hand_names_the_variable():
    with pytest.raises(ValueError, match=r"--mepic-max-chunks 'many'.*\$SGLANG_MEPIC_MAX_CHUNKS"):
        env.Settings.from_env({config.MAX_CHUNKS.env: "many"})
    with pytest.raises(ValueError, match="--mepic-placement 'middle': choose from"):
        env.Settings.from_env({config.PLACEMENT.env: "middle"})
    with pytest.raises(ValueError, match="--mepic-storage-backend file needs --mepic-storage-dir"):
        env.Settings.from_env({config.STORAGE_BACKEND.env: "file"})
    with pytest.raises(ValueError, match="--mepic-chunk-store host: .* needs --mepic-mode epic-K"):
        env.Settings.from_env({config.CHUNK_STORE.env: "host", config.HOST_TIER_GB.env: "1"})
    host = env.Settings.from_env({config.CHUNK_STORE.env: "host", config.HOST_TIER_GB.env: "1",
                                  config.MODE.env: "epic-16"})
    assert host.chunk_store == "host" and env.Settings.from_env({}).chunk_store == "pool"


def test_typed_settings_give_the_table_defaults():
    s = env.Settings.from_env({})
    assert s.mode == modes.Mode(modes.Kind.MEPIC)
    assert s.recompute_blocks == 1 and s.placement is config.Placement.TRAILING
    assert s.compile_sink == "none" and s.text_markup is True
    assert s.host_tier_gb == 0 and s.max_chunks == 64 and s.chat_chunking == "off" and not s.known_texts
    assert s.separator is None and s.storage_backend is None and s.storage_config == {}
    assert s.storage_timeout == 0.5 and s.storage_secret is None and s.verify is False
    assert s.known_texts_bytes == 64_000_000 and s.verify_questions is None and s.reuse_refused is None
    given = env.Settings.from_env({config.AUTO_CHUNK.env: "tools+known", config.STORAGE_DIR.env: "/tmp/x",
                                      config.TEXT_MARKUP.env: "off", config.RECOMPUTE_BLOCKS.env: "all"})
    assert given.chat_chunking == "tools" and given.known_texts and given.storage_backend == "file"
    assert given.text_markup is False and given.recompute_blocks is None
