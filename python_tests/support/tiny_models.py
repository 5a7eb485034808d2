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
