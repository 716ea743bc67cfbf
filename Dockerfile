# One image for the web (daphne), the Celery worker and the relay. The native compression kernels are built
# here (g++ + the ninja wheel): a build failure fails the image instead of silently using the torch fallback.
FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0
# Pango and a font: WeasyPrint renders the energy reports
RUN apt-get update && apt-get install -y --no-install-recommends g++ iproute2 libpango-1.0-0 libpangoft2-1.0-0 fonts-dejavu-core && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY controlplane controlplane
COPY workers workers
COPY native_ops native_ops
COPY frontend frontend
COPY manage.py ./
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -e . \
 && python -m native_ops build
EXPOSE 8000
CMD ["python", "-m", "daphne", "-b", "0.0.0.0", "-p", "8000", "controlplane.asgi:application"]
