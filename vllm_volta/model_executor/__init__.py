"""Model execution: layers, model classes (models/) and weight loading (model_loader/)."""
