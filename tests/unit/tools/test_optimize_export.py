"""The bfloat16 torch.export port of a Hugging Face encoder takes the encoder's own token inputs:
a model without token_type_ids (DistilBERT, MPNet) gets no input it would ignore, and its
candidate's config (named as the ONNX reference's) loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from inferd.testing.models import minilm_files
from inferd.tools import model_config
from inferd.tools.optimize.export import export_hugging_face_torch
from inferd.tools.validate.models import LocalModel


def test_an_encoder_without_token_types_is_exported_with_its_two_inputs(tmp_path: Path) -> None:
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    source = tmp_path / "distilbert"
    torch.manual_seed(0)
    DistilBertModel(DistilBertConfig(vocab_size=30522, dim=32, n_layers=1, n_heads=2, hidden_dim=64)).save_pretrained(
        source
    )
    shutil.copyfile(minilm_files() / "tokenizer.json", source / "tokenizer.json")
    outputs = export_hugging_face_torch(source, tmp_path / "port" / "1" / "model.pt2", "float32")
    assert outputs == ("last_hidden_state",)
    assert list(torch.export.load(str(tmp_path / "port" / "1" / "model.pt2")).graph_signature.user_inputs) == [
        "input_ids",
        "attention_mask",
    ]
    model_config.write(tmp_path / "port", model_config.new_message("port", "pytorch_libtorch", 8))
    model = LocalModel(tmp_path / "port")
    try:
        assert [t.name for t in model.metadata.inputs] == ["input_ids", "attention_mask"]
        ids = np.array([[101, 7592, 102]], np.int64)
        hidden = model.run({"input_ids": ids, "attention_mask": np.ones_like(ids)}, ["OUTPUT__0"])["OUTPUT__0"]
        assert hidden.shape == (1, 3, 32)
    finally:
        model.close()
