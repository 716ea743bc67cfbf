"""Pages of the model knowledge base."""

from django.urls import path, re_path

from controlplane.planning import views

urlpatterns = [
    path("", views.model_list, name="model-list"),
    path("new/", views.model_new, name="model-new"),
    path("<id:pk>/", views.model_detail, name="model-detail"),
    path("<id:pk>/edit/", views.model_edit, name="model-edit"),
    path("<id:pk>/copy/", views.model_copy, name="model-copy"),
    path("<id:pk>/delete/", views.model_delete, name="model-delete"),
    re_path(r"^(?P<pk>[0-9]{1,18})/model\.(?P<fmt>json|yaml)$", views.model_document, name="model-document"),
]
