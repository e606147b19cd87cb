"""config.json parsing: typed values, derived layer roles, errors that name the key."""

import copy

import pytest

from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ConfigError, ModelConfig


def test_golden_config_roles(golden_dir):
    c = ModelConfig.from_file(golden_dir)
    kinds = [r.kind for r in c.roles[: c.num_layers]]
    assert kinds == ["swa", "swa", "full", "reuse", "full", "reuse", "reuse", "full", "reuse", "reindex", "reuse", "reuse"]
    assert [r.kv_source for r in c.roles[:12]] == [None, None, 2, 2, 4, 4, 4, 7, 7, 7, 7, 7]
    assert [r.index_source for r in c.roles[:12]] == [None, None, 2, 2, 4, 4, 4, 7, 7, 9, 9, 9]
    assert c.roles[7].is_candidate_source and c.roles[9].uses_candidates and not c.roles[4].uses_candidates
    assert [r.rope for r in c.roles[:3]] == ["local", "local", "yarn"]
    assert c.ced_split == 7 and [r.is_encoder for r in c.roles[6:8]] == [True, False]
    assert [r.engram_slot for r in c.roles[:5]] == [None, 0, None, None, 1]
    assert [r.tap_slot for r in c.roles[9:12]] == [0, 1, 2]
    stages = c.roles[12:]
    assert [r.prefix for r in stages] == ["mtp.0", "mtp.1", "mtp.2"] and all(r.is_dspark for r in stages)
    assert stages[0].n_routed_experts == 4 and stages[0].num_experts_per_tok == 2
    assert c.quant.weight_block == (32, 32) and c.entries_per_token == 2 * 0.5 + 1


def test_release_shape_preset_parses():
    c = ModelConfig.from_dict(preset_config("bench"))
    assert c.num_layers == 40 and c.ced_split == 20 and c.roles[24].kind == "reindex" and c.roles[21].kind == "reuse"
    assert c.entries_per_token == 2.5  # 890 B/token at 356 B per entry
    assert c.engram_num_embeddings[0] > 0


def _broken(edit):
    raw = copy.deepcopy(preset_config("tiny"))
    edit(raw)
    return raw


@pytest.mark.parametrize("edit, key", [
    (lambda r: r["text_config"].update(scoring_func="softmax"), "text_config.scoring_func"),
    (lambda r: r["text_config"].update(hidden_act="gelu"), "text_config.hidden_act"),
    (lambda r: r["text_config"].update(compress_ratios=[0, 0, 2]), "text_config.compress_ratios"),
    (lambda r: r["text_config"].update(kv_source_layer_ids=[0, 4, 7]), "text_config.kv_source_layer_ids"),
    (lambda r: r["text_config"].update(candidate_source_layer_id=3), "text_config.candidate_source_layer_id"),
    (lambda r: r["text_config"].update(o_groups=3), "text_config.o_groups"),
    (lambda r: r["text_config"].update(hidden_size="64"), "text_config.hidden_size"),
    (lambda r: r["text_config"].pop("sliding_window"), "text_config.sliding_window"),
    (lambda r: r["text_config"]["rope_scaling"].update(rope_type="linear"), "rope_scaling.rope_type"),
    (lambda r: r["quantization_config"].update(quant_method="awq"), "quantization_config.quant_method"),
    (lambda r: r.pop("text_config"), "config.text_config"),
    (lambda r: r["text_config"].update(dspark_target_layer_ids=[11, 12, 13]), "text_config.dspark_target_layer_ids"),
])
def test_bad_values_name_the_key(edit, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ModelConfig.from_dict(_broken(edit))


def test_unknown_keys_are_reported_not_fatal(caplog):
    raw = _broken(lambda r: r["text_config"].update(some_future_knob=3))
    ModelConfig.from_dict(raw)
    assert "some_future_knob" in caplog.text
