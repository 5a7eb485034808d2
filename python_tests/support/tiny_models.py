"""Tiny randomly initialised Hugging Face encoders for the fine-tuning tests (no download):
hidden 32, 2 layers, 4 heads; RoBERTa's position ids start after its padding id, so its
max_position_embeddings must exceed the longest text by 2."""
import torch

TINY_SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
ARCHITECTURES = ("roberta", "bert")


def tiny_config(architecture, *, vocab_size=100, max_position_embeddings=64, dropout=0.0, **extra):
    """The config of a tiny ``architecture`` ("roberta" or "bert") encoder."""
    import transformers
    config_class = {"roberta": transformers.RobertaConfig, "bert": transformers.BertConfig}[architecture]
    return config_class(vocab_size=vocab_size, max_position_embeddings=max_position_embeddings,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        **TINY_SIZES, **extra)


def tiny_classifier(architecture, num_labels=3, *, seed=0, **config_options):
    """A tiny ``*ForSequenceClassification`` with weights drawn from ``seed``."""
    import transformers
    model_class = {"roberta": transformers.RobertaForSequenceClassification,
                   "bert": transformers.BertForSequenceClassification}[architecture]
    torch.manual_seed(seed)
    return model_class(tiny_config(architecture, num_labels=num_labels, **config_options))


def label_token_batch(labels, *, seq_len, pad_id, seed=0):
    """A batch for a tiny encoder whose token ids depend on the label (so that training can
    separate the classes) with padded tails of random length: input_ids, attention_mask, labels."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.as_tensor(labels)
    input_ids = 3 + 30 * labels[:, None] + torch.randint(0, 30, (len(labels), seq_len), generator=generator)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (len(labels),), generator=generator)
    attention_mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    return {"input_ids": input_ids.masked_fill(attention_mask == 0, pad_id),
            "attention_mask": attention_mask, "labels": labels}


class BatchRows(torch.utils.data.Dataset):
    """The rows of one batch dict as a dataset of example dicts (what a Trainer's loader takes)."""

    def __init__(self, batch):
        self.batch = batch

    def __len__(self):
        return len(self.batch["labels"])

    def __getitem__(self, index):
        return {key: value[index] for key, value in self.batch.items()}
