"""The benchmark's models, built the same way by export.py (to ONNX) and bench.py (PyTorch
eager): random weights from fixed seeds, batch-norm running statistics filled from random
batches, so that every system runs the same weights.

Each entry: name -> (label, kind, builder). kind "image" takes x: f32 [N,3,224,224];
"text" takes input_ids: i64 [N,128] in [0, vocab). Every model returns one output.
"""
import torch

SEQ = 128  # the text models' sequence length
IMAGE = (3, 224, 224)


def _fill_batch_norm(model, seed):
    """Running mean and variance as the exact average over four random batches (train mode,
    cumulative averaging), then eval mode: outputs are not all near zero, as they would be
    with a fresh layer's zeros/ones statistics on a random network."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average
    g = torch.Generator().manual_seed(seed + 1000)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn((8,) + IMAGE, generator=g))
    for m, mom in zip(bns, saved):
        m.momentum = mom
    return model.eval()


def _vision(fn):
    def build(seed, statistics=True):
        import torchvision
        torch.manual_seed(seed)
        model = getattr(torchvision.models, fn)(weights=None)
        return _fill_batch_norm(model, seed) if statistics else model.eval()
    return build


def _bert(seed, statistics=True):
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                     max_position_embeddings=512, num_labels=2, attn_implementation="eager")
    return BertForSequenceClassification(cfg).eval()


def _distilbert(seed, statistics=True):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    torch.manual_seed(seed)
    cfg = DistilBertConfig(num_labels=2, attn_implementation="eager")
    return DistilBertForSequenceClassification(cfg).eval()


def _gpt2(seed, statistics=True):
    from transformers import GPT2Config, GPT2Model
    torch.manual_seed(seed)
    cfg = GPT2Config(n_embd=256, n_layer=4, n_head=4, n_positions=SEQ, attn_implementation="eager")
    return GPT2Model(cfg).eval()


MODELS = {
    "resnet18": ("ResNet-18", "image", _vision("resnet18")),
    "mobilenet_v2": ("MobileNetV2", "image", _vision("mobilenet_v2")),
    "efficientnet_b0": ("EfficientNet-B0", "image", _vision("efficientnet_b0")),
    "squeezenet1_1": ("SqueezeNet 1.1", "image", _vision("squeezenet1_1")),
    "vgg11": ("VGG-11", "image", _vision("vgg11")),
    "bert": ("BERT (256 hidden, 4 layers, seq 128)", "text", _bert),
    "distilbert": ("DistilBERT (default config, seq 128)", "text", _distilbert),
    "gpt2": ("GPT-2 (256 embd, 4 layers, seq 128)", "text", _gpt2),
}
# The models that train in the benchmark (both classifiers: logits [N,C]).
TRAINED = ("resnet18", "bert")


class FirstOutput(torch.nn.Module):
    """A transformers model as a plain tensor -> tensor module (logits or the last hidden state)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        # BERT's embeddings take the token types from a buffer through GatherElements when
        # none are given; given (zeros, BERT's default), the export has no GatherElements.
        self.token_types = model.config.model_type == "bert"

    def forward(self, x):
        if self.token_types:
            out = self.model(x, token_type_ids=torch.zeros_like(x), return_dict=False)
        else:
            out = self.model(x, return_dict=False)
        return out[0] if isinstance(out, (tuple, list)) else out


def build(name, seed=0, statistics=True):
    """The model `name` in eval mode as a one-input, one-output module. statistics=False
    skips filling batch norm's running statistics (for a model whose state_dict is loaded
    next)."""
    label, kind, builder = MODELS[name]
    model = builder(seed, statistics)
    return FirstOutput(model).eval() if kind == "text" else model


def vocab(name, model):
    return model.model.config.vocab_size


def example(name, batch, model, seed=0):
    """The benchmark's input for `name` at `batch` (the same for every system)."""
    g = torch.Generator().manual_seed(seed + 7 * batch)
    if MODELS[name][1] == "image":
        return torch.randn((batch,) + IMAGE, generator=g)
    return torch.randint(0, vocab(name, model), (batch, SEQ), generator=g, dtype=torch.int64)


def labels(name, batch, classes, seed=0):
    g = torch.Generator().manual_seed(seed + 11 * batch)
    return torch.randint(0, classes, (batch,), generator=g, dtype=torch.int64)
