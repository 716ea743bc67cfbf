// Redoc on /api/redoc/ (frontend/templates/api/redoc.html): drf-spectacular's inline start-up script, as a
// file, since the Content-Security-Policy allows no inline script
const container = document.getElementById("redoc-container");
Redoc.init(container.dataset.schemaUrl, JSON.parse(container.dataset.settings), container);
