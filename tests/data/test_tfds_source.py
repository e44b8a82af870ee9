"""The TFDS source reads a locally prepared dataset (ArrayRecord) through `tfds.data_source`."""

import json

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from recipe_jax.data.sources import tfds_source  # noqa: E402


class TinyConversations(tfds.core.GeneratorBasedBuilder):
  """Three conversations stored as JSON text, prepared offline."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"prompt": tfds.features.Text(), "response": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    for i in range(3):
      yield i, {"prompt": f"What is {i}+{i}?", "response": f"\\boxed{{{2 * i}}}"}


def test_tfds_source_reads_records_as_python(tmp_path):
  TinyConversations(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  source = tfds_source("tiny_conversations", split="train", data_dir=str(tmp_path))
  assert len(source) == 3
  records = sorted((source[i] for i in range(3)), key=lambda r: r["prompt"])
  assert records[2] == {"prompt": "What is 2+2?", "response": "\\boxed{4}"}
  assert all(isinstance(v, str) for r in records for v in r.values())
  json.dumps(records)  # plain Python, ready for the readers
  with pytest.raises(IndexError):
    source[3]
