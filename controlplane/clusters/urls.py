"""Pages of the cluster knowledge base."""

from django.urls import path, re_path

from controlplane.clusters import views

urlpatterns = [
    path("", views.cluster_list, name="cluster-list"),
    path("new/", views.cluster_new, name="cluster-new"),
    path("<id:pk>/", views.cluster_detail, name="cluster-detail"),
    path("<id:pk>/edit/", views.cluster_edit, name="cluster-edit"),
    path("<id:pk>/copy/", views.cluster_copy, name="cluster-copy"),
    path("<id:pk>/delete/", views.cluster_delete, name="cluster-delete"),
    re_path(
        r"^(?P<pk>[0-9]{1,18})/cluster\.(?P<fmt>json|yaml)$", views.cluster_document, name="cluster-document"
    ),
]
