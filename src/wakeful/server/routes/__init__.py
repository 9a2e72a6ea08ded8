"""The API's routers, one module per concern."""
