"""The one-import switch on a synthetic image set: what fastload chose and why.

    python examples/quickstart.py [--device cuda]
"""

from __future__ import annotations

import argparse
import logging
import tempfile

from fastload import DataLoader, ImageFolder
from fastload.testing.synthetic import make_jpeg_folder

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default=None, help="cuda, cpu, or unset (batches stay on the host)")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    with tempfile.TemporaryDirectory() as tmp:
        root = make_jpeg_folder(tmp, images=256, classes=4, size=(320, 240))
        train = ImageFolder(root, size=128, train=True, normalize=True)
        loader = DataLoader(train, batch_size=32, shuffle=True, device=args.device)
        print(train)
        print(loader.settings)
        for epoch in range(args.epochs):
            seen = 0
            for images, labels in loader:
                seen += labels.numel()
            print(f"epoch {epoch}: {seen} images, last batch {tuple(images.shape)} "
                  f"{images.dtype} on {images.device}, mean {images.float().mean():+.3f}")

if __name__ == "__main__":
    main()
