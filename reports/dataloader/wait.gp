# vramlab report: gnuplot wait.gp in this folder re-renders wait.png
if (!exists("vl_png")) vl_png = 'wait.png'
set terminal png size 800,440 noenhanced
set output vl_png
set title 'Accelerator idle waiting for data, per rung (modeled accelerator)'
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set ylabel '% of step time'
set yrange [0:100]
set xtics rotate by -30
set grid y
plot 'wait.dat' using 2:xtic(1) notitle
