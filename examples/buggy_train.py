"""A small LSTM sequence classifier with two real gradient-management bugs.

Runs on CPU in a few seconds. `gradient-doctor check examples/buggy_train.py` should find,
in main() below:
  * `loss.backward()` gets the loss of one micro-batch, not divided by ACCUM_STEPS, so every
    update uses gradients ACCUM_STEPS times too large (accum-unscaled-loss);
  * `clip_grad_norm_` runs after `optimizer.step()`, when the update has already used the
    unclipped gradients (clip-after-step).
As written the loss blows up (to ~50 within three epochs). It is not the learning rate: with
the same lr, the patch that `check` prints makes it train (loss ~0.01). Compare with
examples/healthy_train.py, the same training done right.
"""

import torch
from torch import nn

ACCUM_STEPS = 4
EPOCHS = 3
BATCHES_PER_EPOCH = 64
BATCH_SIZE = 16
SEQ_LEN = 24
VOCAB = 50
CLASSES = 4


class SequenceClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.head(hidden[:, -1])


def make_batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(BATCHES_PER_EPOCH):
        tokens = torch.randint(0, VOCAB, (BATCH_SIZE, SEQ_LEN), generator=generator)
        labels = tokens[:, -1] % CLASSES  # learnable from the last token
        batches.append((tokens, labels))
    return batches


def main() -> None:
    torch.manual_seed(0)
    model = SequenceClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=2.0, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    data = make_batches(seed=0)

    for epoch in range(EPOCHS):
        for i, (tokens, labels) in enumerate(data):
            loss = loss_fn(model(tokens), labels)
            loss.backward()
            if (i + 1) % ACCUM_STEPS == 0:
                optimizer.step()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                optimizer.zero_grad()
        print(f"epoch {epoch}: last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
