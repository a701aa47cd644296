{{/* The one runledger image: repository@digest, else repository:tag (tag: the chart's appVersion when empty). */}}
{{- define "runledger.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (toString (default .Chart.AppVersion $img.tag)) -}}
{{- end -}}
{{- end -}}

{{/* The worker image prefixes the admission policy allows: this chart's image repository by digest unless set. */}}
{{- define "runledger.allowedImagePrefixes" -}}
{{- default (printf "%s@sha256:" .Values.image.repository) .Values.admissionPolicy.allowedImagePrefixes -}}
{{- end -}}
