"""How well frozen sentence embeddings separate classes: the accuracy of a k-nearest-neighbour
vote and of a logistic-regression probe trained on labelled embeddings and scored on others.

These measure the embedding space, not a fine-tuned classifier: the encoder is not trained on
the labels, only the probe is.
"""
import torch

KNN_NEIGHBOURS = 5


def knn_accuracy(train_embeddings, train_labels, test_embeddings, test_labels, k=KNN_NEIGHBOURS):
    """Accuracy of a majority vote of the ``k`` nearest training embeddings by cosine similarity
    (a tie goes to the tied class with the larger summed similarity)."""
    train = torch.nn.functional.normalize(train_embeddings.double(), dim=1)
    test = torch.nn.functional.normalize(test_embeddings.double(), dim=1)
    train_labels, test_labels = torch.as_tensor(train_labels), torch.as_tensor(test_labels)
    k = min(k, train.shape[0])
    similarities, neighbours = (test @ train.T).topk(k, dim=1)
    classes = int(max(train_labels.max(), test_labels.max())) + 1
    votes = torch.zeros(test.shape[0], classes, dtype=torch.float64)
    votes.scatter_add_(1, train_labels[neighbours], torch.ones_like(similarities))
    # Summed similarities are < k, so they only order classes with equal votes.
    tie_break = torch.zeros_like(votes).scatter_add_(1, train_labels[neighbours], similarities)
    predictions = (votes * (k + 1) + tie_break).argmax(dim=1)
    return (predictions == test_labels).double().mean().item()


def logistic_probe_accuracy(train_embeddings, train_labels, test_embeddings, test_labels, seed=0):
    """Accuracy of scikit-learn's ``LogisticRegression`` (L2, C = 1) fitted on the
    L2-normalised training embeddings."""
    from sklearn.linear_model import LogisticRegression

    def features(embeddings):
        return torch.nn.functional.normalize(embeddings.double(), dim=1).numpy()

    probe = LogisticRegression(max_iter=5000, random_state=seed)
    probe.fit(features(train_embeddings), list(train_labels))
    return float(probe.score(features(test_embeddings), list(test_labels)))


def probe_accuracies(train_embeddings, train_labels, test_embeddings, test_labels, seed=0):
    """``{"knn_accuracy": ..., "logistic_accuracy": ...}``, fractions."""
    return {"knn_accuracy": knn_accuracy(train_embeddings, train_labels, test_embeddings,
                                         test_labels),
            "logistic_accuracy": logistic_probe_accuracy(train_embeddings, train_labels,
                                                         test_embeddings, test_labels, seed)}
